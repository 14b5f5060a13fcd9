//! The XDP programs that steer received frames to AF_XDP sockets, and what they share.
//!
//! An XSK receives nothing by itself: an XDP program on the interface must
//! `bpf_redirect_map` each frame into an XSKMAP slot holding a socket bound to that same
//! queue (af_xdp.rst "XSKMAP / BPF_MAP_TYPE_XSKMAP"). There are two, both in C under `bpf/`
//! (built by clang by `bpf/build.sh`, committed and embedded), both filtering on the IPv4
//! UDP destination port in their `udp_port_be` constant and passing everything else to the
//! kernel stack, so ARP and the host's own traffic keep flowing:
//!
//! * [`RedirectProgram`] (`bpf/xsk_redirect.c`) redirects the frames for one port — or every
//!   frame — by `rx_queue_index`;
//! * the LM program (`bpf/lm.c`, `crate::lm::program`) adds admission control and fragment
//!   order.
//!
//! Both are an [`XdpProgram`] underneath: loaded and attached with aya (pure Rust, no
//! libbpf), with their XSKMAP, and detached when dropped.

use std::fmt;
use std::os::fd::AsFd;

use aya::maps::{Map, MapData, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};

use crate::xsk::{XskError, XskSocket};

/// The `.rodata` constant both programs filter on: the UDP destination port, big-endian.
const PORT_GLOBAL: &str = "udp_port_be";

/// One compiled program: its object, committed beside its source (`bpf/NAME.c`, rebuilt and
/// compared by `bpf/build.sh --check` in CI) so that building this crate needs no clang, and
/// the names of its XDP program and its XSKMAP.
pub(crate) struct Object {
    elf: &'static [u8],
    program: &'static str,
    xsks: &'static str,
}

impl Object {
    /// Whether the object carries `symbol` (a program, map or global name).
    #[cfg(test)]
    pub(crate) fn names(&self, symbol: &str) -> bool {
        self.elf
            .windows(symbol.len())
            .any(|w| w == symbol.as_bytes())
    }
}

/// `bpf/xsk_redirect.c`.
const XSK_REDIRECT: Object = Object {
    elf: aya::include_bytes_aligned!("../bpf/xsk_redirect.o"),
    program: "zcnet_xsk_redirect",
    xsks: "zcnet_xsks",
};

/// `bpf/lm.c`.
pub(crate) const LM: Object = Object {
    elf: aya::include_bytes_aligned!("../bpf/lm.o"),
    program: "zcnet_lm",
    xsks: "zcnet_lm_xsks",
};

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

/// One of our programs loaded into the kernel, with its XSKMAP: what the redirect and LM
/// programs share.
pub(crate) struct XdpProgram {
    ebpf: Ebpf,
    program: &'static str,
    xsks: XskMap<MapData>,
    attached: Option<(u32, AttachMode)>,
}

impl fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdpProgram")
            .field("program", &self.program)
            .field("attached", &self.attached)
            .finish_non_exhaustive()
    }
}

impl XdpProgram {
    /// Loads `obj` with its `udp_port_be` constant set to `port` (0: every frame), and its
    /// XDP program into the kernel (the verifier runs here); takes its XSKMAP.
    pub(crate) fn load(obj: &Object, port: u16) -> Result<XdpProgram, XskError> {
        let mut ebpf = EbpfLoader::new()
            .override_global(PORT_GLOBAL, &port.to_be(), true)
            .load(obj.elf)
            .map_err(|e| program_err("load object", e))?;
        xdp(&mut ebpf, obj.program)?
            .load()
            .map_err(|e| program_err("BPF_PROG_LOAD", e))?;
        let xsks = XskMap::try_from(take_map(&mut ebpf, obj.xsks)?)
            .map_err(|e| program_err("XSKMAP", e))?;
        Ok(XdpProgram {
            ebpf,
            program: obj.program,
            xsks,
            attached: None,
        })
    }

    /// Takes map `name` out of the object, for the program's owner to use.
    pub(crate) fn take_map(&mut self, name: &str) -> Result<Map, XskError> {
        take_map(&mut self.ebpf, name)
    }

    /// Attaches to interface `ifname` of the calling thread's network namespace (a BPF
    /// link, or netlink where links are unavailable). One attachment per program; it lasts
    /// as long as the program.
    pub(crate) fn attach(&mut self, ifname: &str, mode: AttachMode) -> Result<(), XskError> {
        if self.attached.is_some() {
            return Err(XskError::Config("the XDP program is already attached"));
        }
        let ifindex = zcnet_sys::uring::zcrx::ifindex(ifname).map_err(|source| XskError::Io {
            op: "if_nametoindex",
            source,
        })?;
        let flags = match mode {
            AttachMode::Native => XdpMode::Driver,
            AttachMode::Generic => XdpMode::Skb,
        };
        xdp(&mut self.ebpf, self.program)?
            .attach_to_if_index(ifindex, flags)
            .map_err(|e| program_err("attach", e))?;
        self.attached = Some((ifindex, mode));
        Ok(())
    }

    /// Where it is attached: interface index and mode.
    pub(crate) fn attached(&self) -> Option<(u32, AttachMode)> {
        self.attached
    }

    /// Puts bound `socket` in slot `queue` of the XSKMAP.
    pub(crate) fn insert(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XskError> {
        if socket.binding().is_none() {
            return Err(XskError::NotBound);
        }
        self.xsks
            .set(queue, socket.as_fd(), 0)
            .map_err(|e| program_err("XSKMAP update", e))
    }

    /// Empties slot `queue`.
    pub(crate) fn remove(&mut self, queue: u32) -> Result<(), XskError> {
        self.xsks
            .unset(queue)
            .map_err(|e| program_err("XSKMAP delete", e))
    }
}

fn xdp<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp, XskError> {
    ebpf.program_mut(name)
        .ok_or(XskError::Config("XDP object without its program"))?
        .try_into()
        .map_err(|e| program_err("program type", e))
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<Map, XskError> {
    ebpf.take_map(name)
        .ok_or(XskError::Config("XDP object without one of its maps"))
}

/// zcnet's redirect program (`bpf/xsk_redirect.c`), loaded into the kernel, with its XSKMAP.
#[derive(Debug)]
pub struct RedirectProgram {
    prog: XdpProgram,
    udp_port: Option<u16>,
}

impl RedirectProgram {
    /// Loads the program and creates its XSKMAP. `udp_port`: redirect only IPv4 UDP to this
    /// destination port; `None` redirects every frame (ARP included, so the peer then
    /// needs a static neighbour entry).
    pub fn load(udp_port: Option<u16>) -> Result<RedirectProgram, XskError> {
        Ok(RedirectProgram {
            prog: XdpProgram::load(&XSK_REDIRECT, udp_port.unwrap_or(0))?,
            udp_port,
        })
    }

    /// Attaches to interface `ifname` of the calling thread's network namespace (a BPF
    /// link, or netlink where links are unavailable). One attachment per program.
    pub fn attach(&mut self, ifname: &str, mode: AttachMode) -> Result<(), XskError> {
        self.prog.attach(ifname, mode)
    }

    /// Where it is attached: interface index and mode.
    pub fn attached(&self) -> Option<(u32, AttachMode)> {
        self.prog.attached()
    }

    /// The UDP destination port it redirects, if it filters.
    pub fn udp_port(&self) -> Option<u16> {
        self.udp_port
    }

    /// Puts `socket` in slot `queue`: frames received on that queue of the interface now
    /// go to it. The socket must be bound to that queue (the kernel drops a frame redirected
    /// to a socket bound elsewhere) and have an RX ring.
    pub fn insert(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XskError> {
        self.prog.insert(queue, socket)
    }

    /// Empties slot `queue`: its frames go to the kernel stack again.
    pub fn remove(&mut self, queue: u32) -> Result<(), XskError> {
        self.prog.remove(queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_objects_are_elf_and_name_their_program_map_and_port() {
        for obj in [&XSK_REDIRECT, &LM] {
            assert_eq!(&obj.elf[..4], b"\x7fELF");
            for name in [obj.program, obj.xsks, PORT_GLOBAL] {
                assert!(obj.names(name), "{name} missing from {}", obj.program);
            }
        }
    }
}
