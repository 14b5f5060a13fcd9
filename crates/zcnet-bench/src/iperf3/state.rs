//! The one-byte states the server (and, to end a test, the client) sends on the control
//! connection: iperf3's `iperf_api.h` (`TEST_START` 1 … `IPERF_DONE` 16, `ACCESS_DENIED`
//! -1, `SERVER_ERROR` -2), a signed char on the wire.

use super::error::Iperf3Error;

/// A control-connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Data connections are in; the test begins.
    TestStart,
    /// Data flows.
    TestRunning,
    /// The client ends the test.
    TestEnd,
    /// The server asks for the parameters.
    ParamExchange,
    /// The server asks for the data connections.
    CreateStreams,
    /// The server is going away (Ctrl-C).
    ServerTerminate,
    /// The client is going away (Ctrl-C).
    ClientTerminate,
    /// Results are exchanged: client first, then server.
    ExchangeResults,
    /// Both sides print.
    DisplayResults,
    /// The client is done.
    IperfDone,
    /// The server is busy (or the cookie of a data connection is unknown).
    AccessDenied,
    /// The server failed: two big-endian `int32`s follow, iperf3's `i_errno` and `errno`.
    ServerError,
}

impl State {
    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        let v: i8 = match self {
            State::TestStart => 1,
            State::TestRunning => 2,
            State::TestEnd => 4,
            State::ParamExchange => 9,
            State::CreateStreams => 10,
            State::ServerTerminate => 11,
            State::ClientTerminate => 12,
            State::ExchangeResults => 13,
            State::DisplayResults => 14,
            State::IperfDone => 16,
            State::AccessDenied => -1,
            State::ServerError => -2,
        };
        v as u8
    }

    /// The state a byte names.
    pub fn from_byte(b: u8) -> Result<State, Iperf3Error> {
        Ok(match b as i8 {
            1 => State::TestStart,
            2 => State::TestRunning,
            4 => State::TestEnd,
            9 => State::ParamExchange,
            10 => State::CreateStreams,
            11 => State::ServerTerminate,
            12 => State::ClientTerminate,
            13 => State::ExchangeResults,
            14 => State::DisplayResults,
            16 => State::IperfDone,
            -1 => State::AccessDenied,
            -2 => State::ServerError,
            other => return Err(Iperf3Error::UnknownState(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_and_matches_iperf_api_h() {
        let all = [
            (State::TestStart, 1u8),
            (State::TestRunning, 2),
            (State::TestEnd, 4),
            (State::ParamExchange, 9),
            (State::CreateStreams, 10),
            (State::ServerTerminate, 11),
            (State::ClientTerminate, 12),
            (State::ExchangeResults, 13),
            (State::DisplayResults, 14),
            (State::IperfDone, 16),
            (State::AccessDenied, 0xff),
            (State::ServerError, 0xfe),
        ];
        for (s, b) in all {
            assert_eq!(s.byte(), b);
            assert_eq!(State::from_byte(b).unwrap(), s);
        }
        // Retired or never-defined codes (3 = TEST_RUNNING's old neighbour, 15 = unused).
        for b in [0u8, 3, 5, 15, 17, 0x80] {
            assert!(matches!(
                State::from_byte(b),
                Err(Iperf3Error::UnknownState(_))
            ));
        }
    }
}
