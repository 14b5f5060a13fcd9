//! The shared terms every layer speaks: which path an operation took, in which mode, and why
//! a zero-copy path fell back to copying. A leaf: it imports nothing of the crate's, so the
//! paths, the statistics and `auto` can all name these without importing each other.

use serde::Serialize;

/// Which transmit path a [`crate::Sender`] uses for loaned buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TxPath {
    /// Plain `send`: the kernel copies the bytes into socket buffers.
    Copy,
    /// `MSG_ZEROCOPY`: the kernel references the pages; completions return the buffers.
    Zerocopy,
    /// io_uring `SEND_ZC` from registered (fixed) buffers; notification CQEs return them.
    Uring,
    /// `MSG_ZEROCOPY` for [`crate::Sender::send_slice`] too: the slice's pages are
    /// write-protected while in flight and a write gives the writer a private copy, so the
    /// caller keeps copy semantics (loaned buffers go as on `zerocopy`).
    ///
    /// The first `cow` sender starts a process-wide engine that lives as long as the
    /// process: with the userfaultfd backend (the default where the kernel allows
    /// `UFFD_USER_MODE_ONLY` write-protect) a handler thread named `zcnet-cow`; with the
    /// mprotect backend ([`crate::cow::use_backend`], or where userfaultfd is refused) a
    /// `SIGSEGV` handler that chains to any handler installed before it. See [`crate::cow`].
    Cow,
    /// Per operation, the path this host's profile measured cheapest for the size and
    /// alignment, checked against copy on the connection, and demoted while the kernel
    /// reports `COPIED` ([`crate::auto`], `crate::tx::auto`); `copy` where there is no profile.
    Auto,
}

crate::named::named_enum!(TxPath, "transmit path", {
    Copy => "copy",
    Zerocopy => "zerocopy",
    Uring => "uring",
    Cow => "cow",
    Auto => "auto",
});

/// Which receive path a [`crate::Receiver`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RxPath {
    /// Plain `recv`.
    Copy,
    /// `TCP_ZEROCOPY_RECEIVE` into a socket mapping, `recv` for what cannot be mapped.
    Mmap,
    /// io_uring multishot `recv` into a ring of provided buffers (the kernel still copies).
    Uring,
    /// io_uring zero-copy receive (zcrx) into a registered area; needs a NIC with header
    /// split, and falls back to `uring` (or `copy`) where registration is refused.
    Zcrx,
    /// The path this host's profile measured cheapest for the receiver's operation size,
    /// chosen when the connection is accepted; on `mmap`, demoted online to plain `recv`
    /// while mapping keeps failing ([`crate::auto`]). `copy` where there is no profile.
    Auto,
}

crate::named::named_enum!(RxPath, "receive path", {
    Copy => "copy",
    Mmap => "mmap",
    Uring => "uring",
    Zcrx => "zcrx",
    Auto => "auto",
});

/// How [`crate::Sender::send_file`] moves a file range to the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FileTxMode {
    /// `sendfile(2)`: page-cache pages to the socket by reference.
    #[default]
    Sendfile,
    /// `splice(2)` file → pipe → socket.
    Splice,
    /// `pread` + `send`: the copying baseline.
    ReadSend,
}

crate::named::named_enum!(FileTxMode, "file transmit mode", {
    Sendfile => "sendfile",
    Splice => "splice",
    ReadSend => "read_send",
});

/// How [`crate::Receiver::recv_to_file`] moves stream bytes into the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FileRxMode {
    /// `splice(2)` socket → pipe → file: never through user memory.
    #[default]
    Splice,
    /// The receiver's own path (recv, or mapped pages), then `pwrite(2)`.
    Write,
}

crate::named::named_enum!(FileRxMode, "file receive mode", {
    Splice => "splice",
    Write => "write",
});

/// Why an operation that could have gone zero-copy took the copy path instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FallbackReason {
    /// Smaller than the policy's zero-copy threshold: pinning and notification would cost
    /// more than the copy (CMU's crossover, Solaris's threshold).
    TooSmall,
    /// Not page-aligned and the policy requires alignment.
    Unaligned,
    /// `ENOBUFS` persisted after reaping completions; the kernel does not fall back by
    /// itself. Two limits raise it: the socket's option memory, which holds the pending
    /// completion notifications (`net.core.optmem_max`), and the locked-memory limit that
    /// pinned zero-copy pages are charged to (`RLIMIT_MEMLOCK`, `ulimit -l`, for a process
    /// without `CAP_IPC_LOCK`). Raise the one that is low, or send fewer bytes in flight.
    Enobufs,
    /// The socket stopped asking for zero-copy after its completions kept saying COPIED.
    DemotedCopied,
    /// The kernel refused the zero-copy mechanism itself (e.g. `SO_ZEROCOPY` → `ENOPROTOOPT`
    /// on an old kernel, or a socket mapping that cannot be created).
    Unsupported,
    /// Receive: the kernel could not map these bytes (`recv_skip_hint`), read by `recv`.
    Unmappable,
    /// Receive: small or unaligned tail copied by the kernel into the copybuf.
    Copybuf,
    /// File transfer: the file (its file system), or the receive path, refused
    /// `sendfile`/`splice` (`EINVAL`, `ENOSYS`, `EOPNOTSUPP`: no `splice_read`/`splice_write`,
    /// as for many /proc files); the bytes went through user memory (pread+send,
    /// recv+pwrite) instead.
    FileUnsupported,
    /// The kernel could not pin the pages of an io_uring zero-copy send within the locked-
    /// memory limit (`ENOMEM` against `RLIMIT_MEMLOCK`, which io_uring charges when the process
    /// lacks `CAP_IPC_LOCK`) even after in-flight sends completed; the rest was copied. Also
    /// every send of an io_uring path whose ring `io_uring_setup` refused with `ENOMEM` (its
    /// rings are charged to the same limit, shared by all the user's processes).
    Memlock,
    /// `cow` transmit: the application's working set of send buffers is below Solaris's
    /// threshold (Chu, "Zero-Copy TCP in Solaris", §6.4), so it would likely write pages still in flight and pay a
    /// copy-on-write fault (10–30 µs) per page; copying is cheaper.
    SmallWorkingSet,
    /// `cow` transmit: the memory cannot be write-protected — file-backed or shared, not
    /// resident, the thread's stack, or owned by another userfaultfd.
    Unprotectable,
    /// Receive, `auto`: `TCP_ZEROCOPY_RECEIVE` kept mapping nothing on this connection, so
    /// the mapping path is demoted and these bytes went by plain `recv` until a retry.
    DemotedUnmapped,
    /// Transmit, `auto`: the connection's own cost check found the wanted path costlier than
    /// copy in the sending thread's CPU per byte, so these bytes went by copy until the
    /// check's back-off ran out (`crate::auto::cost`).
    Costlier,
    /// AF_XDP (`zcnet-afxdp`'s Lightweight Messages): the socket is bound in copy mode
    /// (`XDP_COPY`), because the driver has no XSK zero-copy (veth: `EOPNOTSUPP`); the kernel
    /// copies each frame between its buffer and the UMEM.
    XskCopyMode,
    /// AF_XDP (`zcnet-afxdp`'s Lightweight Messages): no XSK or no XDP program on this end
    /// (program, bind or attach refused, queue taken), so the LM frames went through the
    /// kernel's UDP socket instead, copied like any datagram.
    XskUnavailable,
    /// Transmit: the peer is this host (a loopback address, or the socket's own address),
    /// where the kernel copies every `MSG_ZEROCOPY` byte at delivery anyway
    /// (docs/measurements/kernel-findings.md §1), so a policy that demotes never asks there
    /// ([`crate::policy::delivery_is_local`]).
    LocalDelivery,
    /// Transmit: the socket has never had a zero-copy notification read, and its calls not
    /// yet notified already cover the bytes the COPIED demotion needs to decide: more
    /// zero-copy would only grow a first try whose answer is still unread (a sender that never
    /// yields to the task reading its notifications sent 30–170 MiB before the answer).
    AwaitingFirstCompletion,
    /// File transfer over TLS (zcnet-transfer): the kernel did not take the connection's
    /// TLS records (kTLS: `TCP_ULP "tls"` refused, as on a kernel without the `tls` module),
    /// so they are made in user space and the file data goes through user memory (read,
    /// encrypted, sent; received, decrypted, written) instead of `sendfile`/`splice`.
    /// Counted once per connection; its bytes are in the copied counters.
    KtlsUnavailable,
}

impl FallbackReason {
    /// All reasons, in the order of their counters.
    pub const ALL: [FallbackReason; 18] = [
        FallbackReason::TooSmall,
        FallbackReason::Unaligned,
        FallbackReason::Enobufs,
        FallbackReason::DemotedCopied,
        FallbackReason::Unsupported,
        FallbackReason::Unmappable,
        FallbackReason::Copybuf,
        FallbackReason::FileUnsupported,
        FallbackReason::Memlock,
        FallbackReason::SmallWorkingSet,
        FallbackReason::Unprotectable,
        FallbackReason::DemotedUnmapped,
        FallbackReason::Costlier,
        FallbackReason::XskCopyMode,
        FallbackReason::XskUnavailable,
        FallbackReason::LocalDelivery,
        FallbackReason::AwaitingFirstCompletion,
        FallbackReason::KtlsUnavailable,
    ];

    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|&r| r == self).unwrap_or(0)
    }

    /// Stable snake_case name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            FallbackReason::TooSmall => "too_small",
            FallbackReason::Unaligned => "unaligned",
            FallbackReason::Enobufs => "enobufs",
            FallbackReason::DemotedCopied => "demoted_copied",
            FallbackReason::Unsupported => "unsupported",
            FallbackReason::Unmappable => "unmappable",
            FallbackReason::Copybuf => "copybuf",
            FallbackReason::FileUnsupported => "file_unsupported",
            FallbackReason::Memlock => "memlock",
            FallbackReason::SmallWorkingSet => "small_working_set",
            FallbackReason::DemotedUnmapped => "demoted_unmapped",
            FallbackReason::Costlier => "costlier",
            FallbackReason::Unprotectable => "unprotectable",
            FallbackReason::XskCopyMode => "xsk_copy_mode",
            FallbackReason::XskUnavailable => "xsk_unavailable",
            FallbackReason::LocalDelivery => "local_delivery",
            FallbackReason::AwaitingFirstCompletion => "awaiting_first_completion",
            FallbackReason::KtlsUnavailable => "ktls_unavailable",
        }
    }
}
