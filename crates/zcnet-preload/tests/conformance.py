"""Conformance of the interposed calls: run with and without libzcnet_preload.so, every
check must hold the same. Calls go through ctypes to the C library's symbols (so through
the library when it is preloaded), which shows their exact results and errno, unlike
Python's socket methods, which retry on EINTR.

Usage: conformance.py [NAME...]  (default: every check). Prints `ok NAME` per check; exits
non-zero at the first failure."""

import ctypes, errno, fcntl, hashlib, mmap, os, select, signal, socket, struct, subprocess, sys
import termios, threading, time

libc = ctypes.CDLL(None, use_errno=True)
libc.send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.send.restype = ctypes.c_ssize_t
libc.writev.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.writev.restype = ctypes.c_ssize_t

MIB = 1 << 20


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def addr(buf):
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def c_send(fd, buf, n=None, flags=0):
    """send(2) of buf[:n]: (result, errno)."""
    n = len(buf) if n is None else n
    ctypes.set_errno(0)
    r = libc.send(fd, addr(buf), n, flags)
    return r, ctypes.get_errno()


def pair():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(1)
    a = socket.create_connection(l.getsockname())
    b, _ = l.accept()
    l.close()
    return a, b


def fill(buf, seed):
    """A pattern that differs per seed and per position."""
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * 128  # 4 KiB
    for o in range(0, len(buf), len(block)):
        end = min(len(buf), o + len(block))
        buf[o:end] = block[: end - o]


class Reader(threading.Thread):
    """Reads a socket to its end, hashing (optionally slowly, signals blocked; optionally
    only once `go` is set)."""

    def __init__(self, sock, delay=0.0, limit=None, go=None):
        super().__init__(daemon=True)
        self.sock, self.delay, self.limit, self.go = sock, delay, limit, go
        self.h, self.n = hashlib.sha256(), 0
        self.start()

    def run(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGALRM})
        if self.go is not None:
            self.go.wait(30)
        buf = bytearray(256 * 1024)
        while self.limit is None or self.n < self.limit:
            want = len(buf) if self.limit is None else min(len(buf), self.limit - self.n)
            k = self.sock.recv_into(buf, want)
            if k == 0:
                break
            self.h.update(memoryview(buf)[:k])
            self.n += k
            if self.delay:
                time.sleep(self.delay)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def overwrite_after_send():
    """Every byte received is the byte in the buffer at the time of its send, though the
    program overwrites the buffer as soon as each send returns."""
    a, b = pair()
    r = Reader(b)
    buf = bytearray(MIB)
    sent = hashlib.sha256()
    for i in range(48):
        fill(buf, i)
        sent.update(buf)
        n, e = c_send(a.fileno(), buf)
        check(n == len(buf), f"blocking send returned {n} errno {e}")
        buf[:] = b"\xee" * len(buf)
    a.close()
    r.join(30)
    check(r.n == 48 * MIB and r.h.digest() == sent.digest(), f"received {r.n} bytes, hash mismatch")


def nonblocking_eagain():
    """A non-blocking socket fills, gives short sends and then EAGAIN; the bytes that
    arrive are exactly the accepted prefixes."""
    a, b = pair()
    a.setblocking(False)
    buf = bytearray(MIB)
    sent = hashlib.sha256()
    total, short, eagain = 0, 0, False
    for i in range(256):
        fill(buf, 1000 + i)
        n, e = c_send(a.fileno(), buf)
        if n < 0:
            check(e == errno.EAGAIN, f"errno {e}, expected EAGAIN")
            eagain = True
            break
        short += n < len(buf)
        sent.update(memoryview(buf)[:n])
        total += n
        buf[:] = b"\x11" * len(buf)
    check(eagain, "the socket never filled")
    r = Reader(b, limit=total)
    r.join(30)
    check(r.n == total and r.h.digest() == sent.digest(), "accepted bytes differ from received")
    a.close()
    b.close()


def eintr_signal_storm():
    """Blocking sends under a storm of signals: each interrupted call returns the bytes it
    sent, or EINTR if none; the stream is exactly the sum of what the calls reported."""
    got = [0]
    signal.signal(signal.SIGUSR1, lambda *_: got.__setitem__(0, got[0] + 1))
    a, b = pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    r = Reader(b, delay=0.0005)
    main = threading.get_ident()
    stop = threading.Event()

    def storm():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.0003)

    t = threading.Thread(target=storm, daemon=True)
    t.start()
    buf = bytearray(4 * MIB)
    sent = hashlib.sha256()
    total, interrupted, i = 0, 0, 0
    deadline = time.time() + 20
    while total < 24 * MIB and time.time() < deadline:
        fill(buf, 2000 + i)
        i += 1
        n, e = c_send(a.fileno(), buf)
        if n < 0:
            check(e == errno.EINTR, f"errno {e}, expected EINTR")
            interrupted += 1
            continue
        interrupted += n < len(buf)
        sent.update(memoryview(buf)[:n])
        total += n
        buf[:] = b"\x22" * len(buf)
    stop.set()
    t.join()
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    a.close()
    r.join(30)
    check(got[0] > 0 and interrupted > 0, f"{got[0]} signals, {interrupted} interrupted calls")
    check(r.n == total and r.h.digest() == sent.digest(), f"stream {r.n} != reported {total}")


def partial_writev():
    """writev of [small, large, small] on a non-blocking socket: the short counts are
    prefixes of the concatenation, and EAGAIN ends it."""
    a, b = pair()
    a.setblocking(False)
    bufs = [bytearray(100), bytearray(MIB), bytearray(200)]
    iov = (Iovec * 3)()
    sent = hashlib.sha256()
    total, partial, eagain = 0, 0, False
    for i in range(256):
        for k, x in enumerate(bufs):
            fill(x, 3000 + 3 * i + k)
            iov[k].base, iov[k].len = addr(x), len(x)
        whole = b"".join(bufs)
        ctypes.set_errno(0)
        n = libc.writev(a.fileno(), ctypes.addressof(iov), 3)
        e = ctypes.get_errno()
        if n < 0:
            check(e == errno.EAGAIN, f"errno {e}, expected EAGAIN")
            eagain = True
            break
        partial += n < len(whole)
        sent.update(whole[:n])
        total += n
        for x in bufs:
            x[:] = b"\x33" * len(x)
    check(eagain and partial > 0, f"eagain {eagain}, partial {partial}")
    r = Reader(b, limit=total)
    r.join(30)
    check(r.n == total and r.h.digest() == sent.digest(), "writev prefixes differ from received")
    a.close()
    b.close()


def no_spurious_errors():
    """Sends in flight never show as POLLERR/EPOLLERR (level-, edge-triggered or one-shot),
    as readability in select, or as SO_ERROR; the data still arrives whole."""
    a, b = pair()
    r = Reader(b)
    fd = a.fileno()
    lt, et, one = select.epoll(), select.epoll(), select.epoll()
    lt.register(fd, select.EPOLLIN | select.EPOLLOUT)
    et.register(fd, select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
    one.register(fd, select.EPOLLOUT | select.EPOLLONESHOT)
    oneshots = 0
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLOUT)
    buf = bytearray(256 * 1024)
    sent = hashlib.sha256()
    for i in range(200):
        fill(buf, 4000 + i)
        sent.update(buf)
        n, e = c_send(fd, buf)
        check(n == len(buf), f"send {n} errno {e}")
        buf[:] = b"\x44" * len(buf)
        for ep, name in ((lt, "level"), (et, "edge")):
            for _, ev in ep.poll(0):
                check(not ev & select.EPOLLERR, f"{name}-triggered epoll reported EPOLLERR ({ev:#x})")
                check(not ev & select.EPOLLIN, f"{name}-triggered epoll reported EPOLLIN")
        for _, ev in one.poll(0):
            check(not ev & select.EPOLLERR, f"one-shot epoll reported EPOLLERR ({ev:#x})")
            oneshots += 1
            one.modify(fd, select.EPOLLOUT | select.EPOLLONESHOT)
        for _, ev in p.poll(0):
            check(not ev & (select.POLLERR | select.POLLIN), f"poll reported {ev:#x}")
        rd, wr, ex = select.select([fd], [fd], [fd], 0)
        check(not rd and not ex, f"select: readable {rd}, exceptional {ex}")
        check(a.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0, "SO_ERROR set")
    # A one-shot registration whose only event was a hidden completion stays armed.
    check(oneshots > 0 and one.poll(1), "the one-shot registration was left disarmed")
    a.close()
    r.join(30)
    check(r.n == 200 * len(buf) and r.h.digest() == sent.digest(), "data differs")


def so_error_after_reset():
    """A real reset is seen: POLLERR, SO_ERROR = ECONNRESET, then EPIPE with exactly one
    SIGPIPE for the failing call."""
    pipes = [0]
    signal.signal(signal.SIGPIPE, lambda *_: pipes.__setitem__(0, pipes[0] + 1))
    a, b = pair()
    r = Reader(b, limit=8 * MIB)
    buf = bytearray(MIB)
    for i in range(8):
        fill(buf, 5000 + i)
        n, e = c_send(a.fileno(), buf)
        check(n == len(buf), f"send {n} errno {e}")
    r.join(30)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()
    p = select.poll()
    p.register(a.fileno(), select.POLLOUT)
    ev = 0
    for _ in range(200):
        res = p.poll(10)
        ev = res[0][1] if res else 0
        if ev & select.POLLERR:
            break
    check(ev & select.POLLERR, f"the reset never showed as POLLERR ({ev:#x})")
    err = a.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    check(err == errno.ECONNRESET, f"SO_ERROR {err}, expected ECONNRESET")
    n, e = c_send(a.fileno(), buf)
    check(n == -1 and e == errno.EPIPE, f"send after reset: {n} errno {e}")
    check(pipes[0] == 1, f"{pipes[0]} SIGPIPEs for one failing send")
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    a.close()


def fork_with_sends_in_flight():
    """fork right after sends: the child's own send and the parent's later ones arrive in
    order and intact; both processes exit cleanly."""
    a, b = pair()
    r = Reader(b)
    buf = bytearray(MIB)
    sent = hashlib.sha256()

    def burst(seed):
        for i in range(8):
            fill(buf, seed + i)
            sent.update(buf)
            n, e = c_send(a.fileno(), buf)
            check(n == len(buf), f"send {n} errno {e}")
            buf[:] = b"\x55" * len(buf)

    burst(6000)
    pid = os.fork()
    if pid == 0:
        fill(buf, 7000)
        n, _ = c_send(a.fileno(), buf)
        buf[:] = b"\x66" * len(buf)
        os._exit(0 if n == len(buf) else 1)
    _, status = os.waitpid(pid, 0)
    check(status == 0, f"child exit status {status}")
    fill(buf, 7000)
    sent.update(buf)
    burst(8000)
    a.close()
    r.join(30)
    check(r.n == 17 * MIB and r.h.digest() == sent.digest(), f"received {r.n}, hash mismatch")


def outq(fd):
    """Bytes sent on fd and not yet acknowledged (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0]


class Watch:
    """Every readiness interface on one socket that has nothing to read: none may report
    an error or readability while another process's sends complete."""

    def __init__(self, fd):
        self.fd = fd
        self.lt, self.et = select.epoll(), select.epoll()
        self.lt.register(fd, select.EPOLLIN)
        self.et.register(fd, select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
        self.p = select.poll()
        self.p.register(fd, select.POLLIN)

    def look(self, who):
        """None if all is quiet, else what was wrong."""
        for ep, name in ((self.lt, "level"), (self.et, "edge")):
            for _, ev in ep.poll(0.002):
                if ev & (select.EPOLLERR | select.EPOLLIN):
                    return f"{who}: {name}-triggered epoll reported {ev:#x}"
        for _, ev in self.p.poll(2):
            if ev & (select.POLLERR | select.POLLIN):
                return f"{who}: poll reported {ev:#x}"
        rd, _, ex = select.select([self.fd], [], [self.fd], 0.002)
        if rd or ex:
            return f"{who}: select: readable {rd}, exceptional {ex}"
        so = socket.socket(fileno=os.dup(self.fd))
        err = so.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        so.close()
        if err:
            return f"{who}: SO_ERROR {err}"
        return None


def watch_until_exit(fd, pid):
    """Watches fd (see Watch) in the parent until child pid exits; its exit status. On a
    failure the child is killed first (it may be blocked sending to the peer this
    process reads)."""
    w = Watch(fd)
    deadline = time.time() + 20
    while True:
        bad = w.look("parent")
        if time.time() > deadline:
            bad = "the child never exited"
        if bad:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            check(False, bad)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status


def send_until_eagain(a, seed, scribble):
    """Sends MiB buffers of the pattern (seeds `seed`, `seed` + 1, …) on the non-blocking
    socket `a` until EAGAIN (64 at most), overwriting each with `scribble` right after its
    send, so that sends are left in flight with their buffer reused. Returns the buffer
    (the caller keeps it alive while they are), the hash of the bytes sent and their count."""
    buf = bytearray(MIB)
    sent = hashlib.sha256()
    total = 0
    for i in range(64):
        fill(buf, seed + i)
        n, e = c_send(a.fileno(), buf)
        if n < 0:
            check(e == errno.EAGAIN, f"errno {e}")
            break
        sent.update(memoryview(buf)[:n])
        total += n
        buf[:] = scribble * len(buf)
    return buf, sent, total


def fork_shares_no_completions():
    """A socket open in parent and child across a fork: while the parent's sends complete
    (the peer starts reading only after the fork), neither process sees POLLERR/EPOLLERR,
    select readiness or SO_ERROR for them; then the child sends, then the parent, and the
    peer gets every byte in order. And the other way (in a fresh process, whose child
    could start the protection engine): while a child sends on a socket the parent holds
    too, the parent sees nothing of it."""
    a, b = pair()
    a.setblocking(False)
    go = threading.Event()
    r = Reader(b, delay=0.002, go=go)
    buf, sent, _ = send_until_eagain(a, 10000, b"\x99")
    a.setblocking(True)
    check(outq(a.fileno()) > 0, "nothing in flight at the fork")
    pid = os.fork()
    if pid == 0:
        try:
            b.close()
            w = Watch(a.fileno())
            deadline = time.time() + 10
            while outq(a.fileno()) > 0 and time.time() < deadline:
                bad = w.look("child")
                if bad:
                    print(bad, flush=True)
                    os._exit(2)
            if outq(a.fileno()) > 0:
                print("child: the parent's sends never completed", flush=True)
                os._exit(3)
            for _ in range(20):
                bad = w.look("child, after")
                if bad:
                    print(bad, flush=True)
                    os._exit(2)
            fill(buf, 11000)
            n, _ = c_send(a.fileno(), buf)
            buf[:] = b"\xaa" * len(buf)
            os._exit(0 if n == len(buf) else 4)
        except BaseException as x:
            print("child:", repr(x), flush=True)
            os._exit(5)
    go.set()
    status = watch_until_exit(a.fileno(), pid)
    check(status == 0, f"child exit status {status:#x}")
    fill(buf, 11000)
    sent.update(buf)
    for i in range(2):
        fill(buf, 12000 + i)
        sent.update(buf)
        n, e = c_send(a.fileno(), buf)
        check(n == len(buf), f"send after the fork {n} errno {e}")
        buf[:] = b"\xbb" * len(buf)
    a.close()
    r.join(30)
    check(r.h.digest() == sent.digest(), f"received {r.n} bytes, hash mismatch")
    # The other way round, in a process of its own (this one's child inherits the
    # protection engine this process started, and so never sends zero-copy).
    env = {k: v for k, v in os.environ.items() if k != "ZCNET_STATS"}
    out = subprocess.run(
        [sys.executable, __file__, "_child_sends_on_a_shared_socket"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    check(out.returncode == 0, f"fresh process: {out.returncode} {out.stdout} {out.stderr}")
    check("ok _child_sends_on_a_shared_socket" in out.stdout, out.stdout)


def _child_sends_on_a_shared_socket():
    """(Run alone, by fork_shares_no_completions.) The child sends with overwrites on a
    socket the parent holds too; the parent polls it all the while."""
    a, b = pair()
    r = Reader(b, delay=0.001)
    buf = bytearray(MIB)
    sent = hashlib.sha256()
    for i in range(16):
        fill(buf, 13000 + i)
        sent.update(buf)
    pid = os.fork()
    if pid == 0:
        b.close()
        for i in range(16):
            fill(buf, 13000 + i)
            n, _ = c_send(a.fileno(), buf)
            buf[:] = b"\xcc" * len(buf)
            if n != len(buf):
                os._exit(4)
        os._exit(0)
    status = watch_until_exit(a.fileno(), pid)
    check(status == 0, f"child exit status {status:#x}")
    a.close()
    r.join(30)
    check(r.n == 16 * MIB and r.h.digest() == sent.digest(), f"received {r.n}, hash mismatch")


class Pollfd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


class Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def kernel_revents(fd):
    """The socket's readiness as the kernel reports it, past any interposed poll: ppoll(2)
    through syscall(2), which no preload library sees."""
    nr = {"x86_64": 271, "aarch64": 73}.get(os.uname().machine)
    if nr is None:
        return None
    p = Pollfd(fd, select.POLLIN, 0)
    ts = Timespec(0, 0)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(nr), ctypes.byref(p), ctypes.c_ulong(1), ctypes.byref(ts),
                     None, ctypes.c_size_t(0))
    check(r >= 0, f"ppoll: errno {ctypes.get_errno()}")
    return p.revents


def parent_exits_with_sends_due():
    """A parent exits while its zero-copy sends on a socket it shares with its child are
    still due; the child, left with the socket, sees no error, drains the completions
    nobody else will read (the kernel's own poll shows no POLLERR left), and the peer gets
    every byte in order, then the end of the stream when the child closes it. The parent
    stays a zombie meanwhile (its parent is busy): a pid that still exists is not a
    process that still runs."""
    env = {k: v for k, v in os.environ.items() if k != "ZCNET_STATS"}
    out = subprocess.run(
        [sys.executable, __file__, "_parent_exits_with_sends_due"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    check("ok _parent_exits_with_sends_due" in out.stdout,
          f"{out.returncode} {out.stdout} {out.stderr}")


def _parent_exits_with_sends_due():
    """(Run alone, by parent_exits_with_sends_due: it must start the engine itself.)"""
    a, b = pair()
    a.setblocking(False)
    buf, sent, _ = send_until_eagain(a, 14000, b"\x77")
    a.setblocking(True)
    check(outq(a.fileno()) > 0, "nothing in flight at the fork")
    parent = os.getpid()
    if os.fork() != 0:
        os._exit(0)
    try:
        deadline = time.time() + 10
        while os.getppid() == parent:
            check(time.time() < deadline, "the parent never exited")
            time.sleep(0.001)
        r = Reader(b)
        w = Watch(a.fileno())
        deadline = time.time() + 20
        while outq(a.fileno()) > 0:
            check(time.time() < deadline, f"the parent's sends never completed: {outq(a.fileno())} bytes unacknowledged, {r.n} received")
            bad = w.look("child")
            check(bad is None, bad)
        for _ in range(20):
            bad = w.look("child, after")
            check(bad is None, bad)
        ev = kernel_revents(a.fileno())
        check(ev is None or not ev & select.POLLERR, f"completions left undrained: {ev:#x}")
        a.close()
        r.join(10)
        check(not r.is_alive(), "no end of stream: the child's close left the connection open")
        check(r.h.digest() == sent.digest(), f"received {r.n} bytes, hash mismatch")
        print("ok _parent_exits_with_sends_due", flush=True)
    except BaseException as x:
        print("child:", repr(x), flush=True)
    finally:
        sys.stdout.flush()
        os._exit(0)


class Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.c_void_p), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", Msghdr), ("len", ctypes.c_uint)]


libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
libc.sendmmsg.restype = ctypes.c_int


def udp_receiver():
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        r.setsockopt(socket.SOL_SOCKET, 33, 4 * MIB)  # SO_RCVBUFFORCE (root)
    except OSError:
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MIB)
    r.bind(("127.0.0.1", 0))
    r.settimeout(5)
    return r


def sendmmsg_keeps_every_datagram():
    """sendmmsg on UDP — runs of equal datagrams with a short last one, mixed sizes, two
    destinations, a connected socket — returns the count sent and sets each msg_len; every
    datagram arrives once, whole, in its own boundaries, in order per destination."""
    r1, r2 = udp_receiver(), udp_receiver()
    sas = []
    for r in (r1, r2):
        sa = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(r.getsockname()[1]),
                         socket.inet_aton("127.0.0.1"))
        sas.append(ctypes.create_string_buffer(sa, len(sa)))
    plans = []
    k = 0
    for rnd in range(6):
        batch = []
        for d in (0, 1):  # ten of 1200 and a short last one, to each destination
            batch += [(d, 1200)] * 10 + [(d, 300 + rnd)]
        batch += [(0, 1000 + 7 * i) for i in range(5)]  # mixed sizes: sent as they are
        batch += [(1, 1400)] * 3  # a run too short for GSO
        batch += [(0, 8000)] * 6  # large equal datagrams
        plans.append(batch)
    unconnected = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    connected = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    connected.connect(r2.getsockname())
    expect = {0: [], 1: []}
    for bi, batch in enumerate(plans):
        use_connected = bi % 2 == 1
        if use_connected:
            batch = [(1, n) for _, n in batch]
        sock = connected if use_connected else unconnected
        bufs, msgs = [], (Mmsghdr * len(batch))()
        iovs = (Iovec * len(batch))()
        for i, (d, n) in enumerate(batch):
            b = bytearray(n)
            fill(b, 20000 + k)
            k += 1
            b[:8] = k.to_bytes(8, "little")
            bufs.append(b)
            expect[d].append(bytes(b))
            iovs[i].base, iovs[i].len = addr(b), n
            msgs[i].hdr.iov = ctypes.addressof(iovs) + i * ctypes.sizeof(Iovec)
            msgs[i].hdr.iovlen = 1
            if not use_connected:
                msgs[i].hdr.name = ctypes.addressof(sas[d])
                msgs[i].hdr.namelen = 16
        done = 0
        while done < len(batch):
            ctypes.set_errno(0)
            n = libc.sendmmsg(sock.fileno(), ctypes.addressof(msgs) + done * ctypes.sizeof(Mmsghdr),
                              len(batch) - done, 0)
            check(n > 0, f"sendmmsg returned {n} errno {ctypes.get_errno()}")
            for i in range(done, done + n):
                check(msgs[i].len == len(bufs[i]), f"msg_len {msgs[i].len} != {len(bufs[i])}")
            done += n
        for b in bufs:  # the program may reuse its buffers at once
            b[:] = b"\xdd" * len(b)
        for d, r in ((0, r1), (1, r2)):
            for want in expect[d]:
                got = r.recv(65536)
                check(got == want, f"datagram of {len(got)} bytes where {len(want)} were sent "
                      f"(seq {int.from_bytes(got[:8], 'little')} vs {int.from_bytes(want[:8], 'little')})")
            expect[d] = []
    for r in (r1, r2):
        r.setblocking(False)
        try:
            extra = r.recv(65536)
            check(False, f"an extra datagram of {len(extra)} bytes")
        except BlockingIOError:
            pass
    for x in (r1, r2, unconnected, connected):
        x.close()


def huge_page_buffer():
    """Sends from a buffer in transparent huge pages (2 MiB aligned, MADV_HUGEPAGE), left
    unchanged between sends (so the library may send it protected, where protecting huge
    pages costs less than copying), arrive intact."""
    huge, size = 2 * MIB, 8 * MIB
    m = mmap.mmap(-1, size + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    off = (-base) % huge
    m.madvise(mmap.MADV_HUGEPAGE, off, size)
    view = memoryview(m)[off:off + size]
    fill(view, 14000)
    a, b = pair()
    r = Reader(b)
    sent = hashlib.sha256()
    ptr = base + off
    for i in range(4):
        sent.update(view)
        ctypes.set_errno(0)
        n = libc.send(a.fileno(), ptr, size, 0)
        check(n == size, f"send {n} errno {ctypes.get_errno()}")
    a.close()
    r.join(30)
    check(r.n == 4 * size and r.h.digest() == sent.digest(), f"received {r.n}, hash mismatch")
    view.release()


def close_in_flight():
    """close right after a large send: the peer gets every byte and then the end of stream."""
    a, b = pair()
    buf = bytearray(4 * MIB)
    fill(buf, 9000)
    want = hashlib.sha256(buf).digest()
    r = Reader(b)
    n, e = c_send(a.fileno(), buf)
    check(n == len(buf), f"send {n} errno {e}")
    buf[:] = b"\x77" * len(buf)
    a.close()
    r.join(10)
    check(not r.is_alive(), "no end of stream after close")
    check(r.n == 4 * MIB and r.h.digest() == want, "data differs")


def close_while_peer_not_reading():
    """close with data queued that the peer has not read: close returns at once, and the
    peer, reading later, gets every byte and then the end of stream."""
    a, b = pair()
    a.setblocking(False)
    buf, sent, total = send_until_eagain(a, 9800, b"\x88")
    # The peer reads only after close returns, so a close that waited for the pages in
    # flight would never return on its own (the join bounds the wait: a hang guard).
    closer = threading.Thread(target=a.close, daemon=True)
    closer.start()
    closer.join(10)
    check(not closer.is_alive(), "close waited for the peer to read")
    time.sleep(0.2)
    r = Reader(b)
    r.join(10)
    check(not r.is_alive(), "no end of stream")
    check(r.n == total and r.h.digest() == sent.digest(), f"received {r.n} of {total}")


def own_zerocopy_is_not_hidden():
    """A program's own MSG_ZEROCOPY completions are its own: POLLERR shows them and its
    recvmsg(MSG_ERRQUEUE) reads them (and this is the readiness the library hides for
    the completions of its own sends)."""
    a, b = pair()
    r = Reader(b)
    a.setsockopt(socket.SOL_SOCKET, 60, 1)  # SO_ZEROCOPY
    buf = bytearray(MIB)
    fill(buf, 9500)
    n, e = c_send(a.fileno(), buf, flags=0x4000000)  # MSG_ZEROCOPY
    check(n == len(buf), f"send {n} errno {e}")
    p = select.poll()
    p.register(a.fileno(), select.POLLIN)
    ev = 0
    for _ in range(100):
        res = p.poll(10)
        ev = res[0][1] if res else 0
        if ev & select.POLLERR:
            break
    check(ev & select.POLLERR, f"no POLLERR for the program's own completion ({ev:#x})")
    _, anc, _, _ = a.recvmsg(0, 256, socket.MSG_ERRQUEUE)
    origins = [d[4] for lvl, typ, d in anc if len(d) > 4]  # sock_extended_err.ee_origin
    check(5 in origins, f"no zerocopy completion in the error queue: {anc}")
    a.close()
    r.join(30)
    check(r.n == MIB, "data lost")


CHECKS = [
    overwrite_after_send,
    nonblocking_eagain,
    eintr_signal_storm,
    partial_writev,
    no_spurious_errors,
    so_error_after_reset,
    fork_with_sends_in_flight,
    fork_shares_no_completions,
    parent_exits_with_sends_due,
    sendmmsg_keeps_every_datagram,
    huge_page_buffer,
    close_in_flight,
    close_while_peer_not_reading,
    own_zerocopy_is_not_hidden,
]

if __name__ == "__main__":
    names = sys.argv[1:]
    if names == ["_child_sends_on_a_shared_socket"]:
        _child_sends_on_a_shared_socket()
        print("ok", names[0], flush=True)
        sys.exit(0)
    if names == ["_parent_exits_with_sends_due"]:
        _parent_exits_with_sends_due()
    for c in CHECKS:
        if names and c.__name__ not in names:
            continue
        c()
        print("ok", c.__name__, flush=True)
