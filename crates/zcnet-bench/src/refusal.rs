//! [`Refusal`]: the one error type of the bench's checks, a leaf both the protocol and the
//! report use.

/// Why a run's parameters, a message or the two ends' counts are refused: one sentence for
/// the user (and, for a refused hello, the `reject` reason sent to the peer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl std::ops::Deref for Refusal {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}
