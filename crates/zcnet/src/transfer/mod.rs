//! File transfer: the protocol, the receiver's safety rules and both ends of a session.
//! The wire format is specified in `docs/transfer-protocol.md`.

pub mod auth;
pub mod names;
pub mod store;
pub mod wire;
