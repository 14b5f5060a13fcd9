//! The LM XDP program (`bpf/lm.c`): admission control and fragment order enforced before a
//! frame takes a FILL chunk. Loaded and attached like [`crate::RedirectProgram`] (both are
//! a `crate::program::XdpProgram`); detached when dropped.
//!
//! Its two one-entry maps are eight `u32` words each (the layout is the C file's `A_*` and
//! `P_*` indices): [`LmProgram::admit`] writes the admission, [`LmProgram::progress`] reads
//! what the program counted.

use std::fmt;
use std::net::SocketAddrV4;

use aya::maps::{Array, MapData};

use crate::program::{program_err, AttachMode, XdpProgram, LM};
use crate::xsk::{XskError, XskSocket};

const ADMIT: &str = "zcnet_lm_admit";
const PROGRESS: &str = "zcnet_lm_progress";

type Words = [u32; 8];

/// Who may send DATA frames now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admission {
    /// The admitted sender's address and UDP source port.
    pub(crate) sender: SocketAddrV4,
    /// The token its frames must carry.
    pub(crate) token: u32,
    /// Fragments in its message (the program expects `count - 1` down to `0`).
    pub(crate) count: u32,
}

/// What the program counted (`lm_progress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Progress {
    /// The token the next two counts belong to.
    pub token: u32,
    /// DATA frames of that token passed to the socket.
    pub received: u32,
    /// A frame of that token came out of order: the rest of it is dropped.
    pub broken: bool,
    /// LM frames dropped because their sender was not admitted (ever).
    pub foreign: u32,
    /// DATA frames dropped for order (ever).
    pub order: u32,
    /// DATA frames dropped by fault injection (ever).
    pub injected: u32,
    /// PAD frames passed (ever).
    pub pads: u32,
}

/// The LM program, loaded, with its maps. An [`crate::LmSocket`] loads, attaches and
/// drives it; [`LmProgram::load`] alone tells whether this kernel's verifier accepts it
/// (`zcnet probe` asks that).
pub struct LmProgram {
    prog: XdpProgram,
    admit: Array<MapData, Words>,
    progress: Array<MapData, Words>,
    words: Words,
}

impl fmt::Debug for LmProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmProgram")
            .field("prog", &self.prog)
            .field("admit", &self.words)
            .finish_non_exhaustive()
    }
}

impl LmProgram {
    /// Loads the program for LM datagrams to UDP port `port`, with nobody admitted.
    pub fn load(port: u16) -> Result<LmProgram, XskError> {
        let mut prog = XdpProgram::load(&LM, port)?;
        let admit =
            Array::try_from(prog.take_map(ADMIT)?).map_err(|e| program_err("admit map", e))?;
        let progress = Array::try_from(prog.take_map(PROGRESS)?)
            .map_err(|e| program_err("progress map", e))?;
        Ok(LmProgram {
            prog,
            admit,
            progress,
            words: [0; 8],
        })
    }

    /// Attaches to `ifname` in the calling thread's namespace.
    pub(crate) fn attach(&mut self, ifname: &str, mode: AttachMode) -> Result<(), XskError> {
        self.prog.attach(ifname, mode)
    }

    /// Steers frames of `queue` to `socket` (bound to that queue).
    pub(crate) fn insert(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XskError> {
        self.prog.insert(queue, socket)
    }

    /// Admits one sender (`Some`) or nobody (`None`). Write it only between messages: the
    /// program reads the entry without a lock, and a frame racing the update could see half
    /// of it — which at worst drops that frame.
    pub(crate) fn admit(&mut self, who: Option<Admission>) -> Result<(), XskError> {
        match who {
            Some(a) => {
                self.words[0] = 1;
                self.words[1] = u32::from_ne_bytes(a.sender.ip().octets());
                self.words[2] = u32::from(u16::from_ne_bytes(a.sender.port().to_be_bytes()));
                self.words[3] = u32::from_ne_bytes(a.token.to_be_bytes());
                self.words[4] = a.count;
            }
            None => self.words[..5].fill(0),
        }
        self.write()
    }

    /// Fault injection, as netem would (this kernel has no netem): the program drops every
    /// `n`-th DATA frame of admitted senders and breaks that message; 0 turns it off. The
    /// tests use it to show that a lost fragment is a lost message, never wrong bytes.
    pub(crate) fn drop_every(&mut self, n: u32) -> Result<(), XskError> {
        self.words[5] = n;
        self.write()
    }

    fn write(&mut self) -> Result<(), XskError> {
        self.admit
            .set(0, self.words, 0)
            .map_err(|e| program_err("admit map update", e))
    }

    /// The program's counters.
    pub(crate) fn progress(&self) -> Result<Progress, XskError> {
        let w = self
            .progress
            .get(&0, 0)
            .map_err(|e| program_err("progress map lookup", e))?;
        Ok(Progress {
            token: u32::from_be_bytes(w[0].to_ne_bytes()),
            received: w[1],
            broken: w[2] != 0,
            foreign: w[3],
            order: w[4],
            injected: w[5],
            pads: w[7],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_names_its_maps() {
        for name in [ADMIT, PROGRESS] {
            assert!(LM.names(name), "{name} missing from lm.o");
        }
    }
}
