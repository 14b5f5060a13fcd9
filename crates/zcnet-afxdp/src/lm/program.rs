//! The LM XDP program (`bpf/lm.c`): admission control and fragment order enforced before a
//! frame takes a FILL chunk. Loaded and attached with aya like
//! [`crate::xsk::RedirectProgram`]; detached when dropped.
//!
//! Its two one-entry maps are eight `u32` words each (the layout is the C file's `A_*` and
//! `P_*` indices): [`LmProgram::admit`] writes the admission, [`LmProgram::progress`] reads
//! what the program counted.

use std::fmt;
use std::net::SocketAddrV4;

use aya::maps::{Array, MapData, XskMap};
use aya::Ebpf;

use crate::xsk::program::{attach_xdp, insert_xsk, load_xdp, program_err};
use crate::xsk::{AttachMode, XskError, XskSocket};

const PROGRAM: &str = "zcnet_lm";
const XSKS: &str = "zcnet_lm_xsks";
const ADMIT: &str = "zcnet_lm_admit";
const PROGRESS: &str = "zcnet_lm_progress";
/// The `.rodata` constant both programs filter on (set by `load_xdp`).
#[cfg(test)]
const PORT_GLOBAL: &str = "udp_port_be";

type Words = [u32; 8];

/// The compiled program, committed beside its source (`bpf/lm.c`, rebuilt and compared by
/// `bpf/build.sh --check` in CI) so that building zcnet needs no clang. `Option` because the
/// loaders treat a missing program as "AF_XDP unavailable here", the same way as a kernel
/// that refuses it.
fn object() -> Option<&'static [u8]> {
    Some(aya::include_bytes_aligned!("../../bpf/lm.o"))
}

/// Who may send DATA frames now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The admitted sender's address and UDP source port.
    pub sender: SocketAddrV4,
    /// The token its frames must carry.
    pub token: u32,
    /// Fragments in its message (the program expects `count - 1` down to `0`).
    pub count: u32,
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

/// The LM program, loaded, with its maps.
pub struct LmProgram {
    ebpf: Ebpf,
    xsks: XskMap<MapData>,
    admit: Array<MapData, Words>,
    progress: Array<MapData, Words>,
    words: Words,
    attached: Option<(u32, AttachMode)>,
}

impl fmt::Debug for LmProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmProgram")
            .field("attached", &self.attached)
            .field("admit", &self.words)
            .finish_non_exhaustive()
    }
}

impl LmProgram {
    /// Whether this build carries the program: always, since the object is committed and
    /// embedded (kept so callers need not change if a build ever leaves it out).
    pub fn is_built() -> bool {
        object().is_some()
    }

    /// Loads the program for LM datagrams to UDP port `port`, with nobody admitted.
    pub fn load(port: u16) -> Result<LmProgram, XskError> {
        let obj = object().ok_or(XskError::ProgramNotBuilt)?;
        let mut ebpf = load_xdp(obj, PROGRAM, port.to_be())?;
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or(XskError::Config("LM object without one of its maps"))
        };
        let xsks = XskMap::try_from(take(XSKS)?).map_err(|e| program_err("XSKMAP", e))?;
        let admit = Array::try_from(take(ADMIT)?).map_err(|e| program_err("admit map", e))?;
        let progress =
            Array::try_from(take(PROGRESS)?).map_err(|e| program_err("progress map", e))?;
        Ok(LmProgram {
            ebpf,
            xsks,
            admit,
            progress,
            words: [0; 8],
            attached: None,
        })
    }

    /// Attaches to `ifname` in the calling thread's namespace.
    pub fn attach(&mut self, ifname: &str, mode: AttachMode) -> Result<(), XskError> {
        let ifindex = attach_xdp(&mut self.ebpf, PROGRAM, ifname, mode)?;
        self.attached = Some((ifindex, mode));
        Ok(())
    }

    /// Where it is attached.
    pub fn attached(&self) -> Option<(u32, AttachMode)> {
        self.attached
    }

    /// Steers frames of `queue` to `socket` (bound to that queue).
    pub fn insert(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XskError> {
        insert_xsk(&mut self.xsks, queue, socket)
    }

    /// Admits one sender (`Some`) or nobody (`None`). Write it only between messages: the
    /// program reads the entry without a lock, and a frame racing the update could see half
    /// of it — which at worst drops that frame.
    pub fn admit(&mut self, who: Option<Admission>) -> Result<(), XskError> {
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
    pub fn drop_every(&mut self, n: u32) -> Result<(), XskError> {
        self.words[5] = n;
        self.write()
    }

    fn write(&mut self) -> Result<(), XskError> {
        self.admit
            .set(0, self.words, 0)
            .map_err(|e| program_err("admit map update", e))
    }

    /// The program's counters.
    pub fn progress(&self) -> Result<Progress, XskError> {
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
    fn the_object_names_its_program_maps_and_port() {
        let Some(obj) = object() else {
            assert!(!LmProgram::is_built());
            return;
        };
        let has = |s: &str| obj.windows(s.len()).any(|w| w == s.as_bytes());
        for name in [PROGRAM, XSKS, ADMIT, PROGRESS, PORT_GLOBAL] {
            assert!(has(name), "{name} missing from lm.o");
        }
    }
}
