"""Run by given_back_in_flight.rs under the library: memory a zero-copy send may still
read is given back — free, realloc, madvise(MADV_DONTNEED), mremap, munmap — then reused,
and the kernel writes into it through a call the library does not interpose (a raw
syscall(SYS_getrandom)). The write must not fail (EFAULT), the bytes the program keeps
(realloc, mremap) must be its own, and every byte must arrive as sent (a SHA-256 of each
end). The reader is slow on purpose: the tail of each send is still queued, its pages in
flight, when the program gives the memory back.

Usage: given_back_in_flight.py ROUNDS [CASE,...] (free, realloc, madvise, mremap, munmap;
all by default)"""

import ctypes, hashlib, os, socket, sys, threading, time

ROUNDS = int(sys.argv[1])
N = 4 << 20
SYS_GETRANDOM = {"x86_64": 318, "aarch64": 278}[os.uname().machine]
PROT_RW, MAP_PRIVATE_ANON = 3, 0x22
MADV_DONTNEED, MREMAP_MAYMOVE = 4, 1
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

libc = ctypes.CDLL(None, use_errno=True)
vp, sz = ctypes.c_void_p, ctypes.c_size_t
for name, res, args in [
    ("malloc", vp, [sz]),
    ("free", None, [vp]),
    ("realloc", vp, [vp, sz]),
    ("mmap", vp, [vp, sz, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]),
    ("munmap", ctypes.c_int, [vp, sz]),
    ("madvise", ctypes.c_int, [vp, sz, ctypes.c_int]),
    ("mremap", vp, [vp, sz, sz, ctypes.c_int]),
    ("mallopt", ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
]:
    f = getattr(libc, name)
    f.restype, f.argtypes = res, args
libc.syscall.restype = ctypes.c_long

# Chunks of N from the main heap, never trimmed: malloc hands a freed chunk straight back.
assert libc.mallopt(M_MMAP_THRESHOLD, 16 << 20) == 1
assert libc.mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1


def kernel_fill(p, n):
    """getrandom(2) into p[:n] by a raw system call: a kernel write the library does
    not interpose."""
    done = 0
    while done < n:
        r = libc.syscall(ctypes.c_long(SYS_GETRANDOM), vp(p + done), sz(n - done), 0)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e) + " (raw getrandom into reused memory)")
        done += r


def view(p, n):
    return (ctypes.c_char * n).from_address(p)


def mmap_anon(n):
    p = libc.mmap(None, n, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
    assert p is not None and p != ctypes.c_void_p(-1).value
    return p


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
got = {}


def reader():
    c, _ = listener.accept()
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        h.update(b)
        n += len(b)
        time.sleep(0.0002)
    got["h"], got["n"] = h.digest(), n


t = threading.Thread(target=reader, daemon=True)
t.start()
s = socket.create_connection(listener.getsockname())
sent, total = hashlib.sha256(), 0


def send(p, n):
    global total
    data = view(p, n)
    sent.update(bytes(data))
    s.sendall(data)
    total += n
    return hashlib.sha256(bytes(data)).digest()


def given_back_by_free():
    # malloc hands the chunk back at once; its pages must take the kernel's write.
    p = libc.malloc(N)
    kernel_fill(p, N)
    send(p, N)
    libc.free(p)
    p = libc.malloc(N)
    kernel_fill(p, N)
    libc.free(p)


def given_back_by_realloc():
    # A realloc that moves: the old chunk is freed inside realloc.
    p = libc.malloc(N)
    kernel_fill(p, N)
    blocker = libc.malloc(256 << 10)  # after p: realloc cannot grow p in place
    h = send(p, N)
    q = libc.realloc(p, 2 * N)
    assert q, "realloc"
    assert hashlib.sha256(bytes(view(q, N))).digest() == h, "realloc kept other bytes"
    r = libc.malloc(N)
    kernel_fill(r, N)
    libc.free(r)
    libc.free(q)
    libc.free(blocker)


def given_back_by_madvise():
    # MADV_DONTNEED: the pages read back as zeros, then take the kernel's write.
    m = mmap_anon(N)
    kernel_fill(m, N)
    send(m, N)
    assert libc.madvise(m, N, MADV_DONTNEED) == 0
    kernel_fill(m, N)
    send(m, N)
    assert libc.munmap(m, N) == 0


def given_back_by_mremap():
    # An mremap that moves: the bytes move with it and take writes of both kinds.
    m = mmap_anon(N)
    kernel_fill(m, N)
    h = send(m, N)
    m2 = libc.mremap(m, N, 2 * N, MREMAP_MAYMOVE)
    assert m2 is not None and m2 != ctypes.c_void_p(-1).value, "mremap"
    assert hashlib.sha256(bytes(view(m2, N))).digest() == h, "mremap kept other bytes"
    ctypes.memset(m2, 7, 4096)
    kernel_fill(m2 + 4096, N)
    assert libc.munmap(m2, 2 * N) == 0


def given_back_by_munmap():
    # munmap, and a new mapping (often at the same address) written by the kernel.
    m = mmap_anon(N)
    kernel_fill(m, N)
    send(m, N)
    assert libc.munmap(m, N) == 0
    m = mmap_anon(N)
    kernel_fill(m, N)
    assert libc.munmap(m, N) == 0


CASES = {
    "free": given_back_by_free,
    "realloc": given_back_by_realloc,
    "madvise": given_back_by_madvise,
    "mremap": given_back_by_mremap,
    "munmap": given_back_by_munmap,
}
chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
for _ in range(ROUNDS):
    for name in chosen:
        CASES[name]()

s.close()
t.join(300)
assert got.get("n") == total and got["h"] == sent.digest(), (got.get("n"), total)
print("ok", total, flush=True)
