//! The XDP program that steers received frames to AF_XDP sockets.
//!
//! An XSK receives nothing by itself: an XDP program on the interface must
//! `bpf_redirect_map` each frame into an XSKMAP slot holding a socket bound to that same
//! queue (af_xdp.rst "XSKMAP / BPF_MAP_TYPE_XSKMAP"). Ours (`bpf/xsk_redirect.c`, built by
//! clang by bpf/build.sh, committed and embedded) redirects IPv4 UDP frames for one destination port — or every frame —
//! by `rx_queue_index`, and passes everything else to the kernel stack, so ARP and the host's
//! own traffic keep flowing. It is loaded and attached with aya (pure Rust, no libbpf), and
//! detached when the [`RedirectProgram`] is dropped.

use std::fmt;
use std::os::fd::AsFd;

use aya::maps::{MapData, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};

use super::{XskError, XskSocket};

const PROGRAM: &str = "zcnet_xsk_redirect";
const MAP: &str = "zcnet_xsks";
const PORT_GLOBAL: &str = "udp_port_be";

/// The compiled program, committed beside its source (`bpf/xsk_redirect.c`, rebuilt and compared by
/// `bpf/build.sh --check` in CI) so that building zcnet needs no clang. `Option` because the
/// loaders treat a missing program as "AF_XDP unavailable here", the same way as a kernel
/// that refuses it.
fn object() -> Option<&'static [u8]> {
    Some(aya::include_bytes_aligned!("../../bpf/xsk_redirect.o"))
}

/// Where the program runs (`XDP_FLAGS_DRV_MODE` / `XDP_FLAGS_SKB_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// Native XDP in the driver, before an skb exists (veth has it).
    Native,
    /// Generic XDP on the skb, for any interface; slower, same semantics.
    Generic,
}

impl AttachMode {
    /// `native` or `generic`.
    pub fn name(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
        }
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

pub(crate) fn program_err(
    op: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> XskError {
    XskError::Program {
        op,
        source: Box::new(e),
    }
}

/// Puts bound `socket` in slot `queue` of an XSKMAP. Shared with the LM program.
pub(crate) fn insert_xsk(
    xsks: &mut XskMap<MapData>,
    queue: u32,
    socket: &XskSocket,
) -> Result<(), XskError> {
    if socket.binding().is_none() {
        return Err(XskError::NotBound);
    }
    xsks.set(queue, socket.as_fd(), 0)
        .map_err(|e| program_err("XSKMAP update", e))
}

/// Loads object `obj` with its `udp_port_be` constant set, and its XDP program `name` into
/// the kernel (the verifier runs here). Shared with the LM program (`crate::lm`).
pub(crate) fn load_xdp(obj: &[u8], name: &str, port_be: u16) -> Result<Ebpf, XskError> {
    let mut ebpf = EbpfLoader::new()
        .override_global(PORT_GLOBAL, &port_be, true)
        .load(obj)
        .map_err(|e| program_err("load object", e))?;
    let xdp: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or(XskError::Config("XDP object without its program"))?
        .try_into()
        .map_err(|e| program_err("program type", e))?;
    xdp.load().map_err(|e| program_err("BPF_PROG_LOAD", e))?;
    Ok(ebpf)
}

/// Attaches program `name` of `ebpf` to `ifname` of the calling thread's namespace (a BPF
/// link, or netlink where links are unavailable); returns the interface index. The link
/// lives as long as `ebpf`.
pub(crate) fn attach_xdp(
    ebpf: &mut Ebpf,
    name: &str,
    ifname: &str,
    mode: AttachMode,
) -> Result<u32, XskError> {
    let ifindex = zcnet_sys::uring::zcrx::ifindex(ifname).map_err(|source| XskError::Io {
        op: "if_nametoindex",
        source,
    })?;
    let xdp: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or(XskError::Config("XDP object without its program"))?
        .try_into()
        .map_err(|e| program_err("program type", e))?;
    let flags = match mode {
        AttachMode::Native => XdpMode::Driver,
        AttachMode::Generic => XdpMode::Skb,
    };
    xdp.attach_to_if_index(ifindex, flags)
        .map_err(|e| program_err("attach", e))?;
    Ok(ifindex)
}

/// zcnet's redirect program, loaded into the kernel, with its XSKMAP.
pub struct RedirectProgram {
    ebpf: Ebpf,
    xsks: XskMap<MapData>,
    attached: Option<(u32, AttachMode)>,
    udp_port: Option<u16>,
}

impl fmt::Debug for RedirectProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedirectProgram")
            .field("attached", &self.attached)
            .field("udp_port", &self.udp_port)
            .finish_non_exhaustive()
    }
}

impl RedirectProgram {
    /// Whether this build carries the program: always, since the object is committed and
    /// embedded (kept so callers need not change if a build ever leaves it out).
    pub fn is_built() -> bool {
        object().is_some()
    }

    /// Loads the program and creates its XSKMAP. `udp_port`: redirect only IPv4 UDP to this
    /// destination port; `None` redirects every frame (ARP included, so the peer then
    /// needs a static neighbour entry).
    pub fn load(udp_port: Option<u16>) -> Result<RedirectProgram, XskError> {
        let obj = object().ok_or(XskError::ProgramNotBuilt)?;
        let mut ebpf = load_xdp(obj, PROGRAM, udp_port.unwrap_or(0).to_be())?;
        let map = ebpf
            .take_map(MAP)
            .ok_or(XskError::Config("XDP object without its XSKMAP"))?;
        let xsks = XskMap::try_from(map).map_err(|e| program_err("XSKMAP", e))?;
        Ok(RedirectProgram {
            ebpf,
            xsks,
            attached: None,
            udp_port,
        })
    }

    /// Attaches to interface `ifname` of the calling thread's network namespace (a BPF
    /// link, or netlink where links are unavailable). One attachment per program.
    pub fn attach(&mut self, ifname: &str, mode: AttachMode) -> Result<(), XskError> {
        if self.attached.is_some() {
            return Err(XskError::Config("the XDP program is already attached"));
        }
        let ifindex = attach_xdp(&mut self.ebpf, PROGRAM, ifname, mode)?;
        self.attached = Some((ifindex, mode));
        Ok(())
    }

    /// Where it is attached: interface index and mode.
    pub fn attached(&self) -> Option<(u32, AttachMode)> {
        self.attached
    }

    /// The UDP destination port it redirects, if it filters.
    pub fn udp_port(&self) -> Option<u16> {
        self.udp_port
    }

    /// Puts `socket` in slot `queue`: frames received on that queue of the interface now
    /// go to it. The socket must be bound to that queue (the kernel drops a frame redirected
    /// to a socket bound elsewhere) and have an RX ring.
    pub fn insert(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XskError> {
        insert_xsk(&mut self.xsks, queue, socket)
    }

    /// Empties slot `queue`: its frames go to the kernel stack again.
    pub fn remove(&mut self, queue: u32) -> Result<(), XskError> {
        self.xsks
            .unset(queue)
            .map_err(|e| program_err("XSKMAP delete", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_built_here_and_names_program_and_map() {
        // The object is embedded from bpf/; a build without it would say so in is_built().
        let Some(obj) = object() else {
            assert!(!RedirectProgram::is_built());
            return;
        };
        assert_eq!(&obj[..4], b"\x7fELF");
        let has = |s: &str| obj.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has(PROGRAM) && has(MAP) && has(PORT_GLOBAL));
    }
}
