#!/usr/bin/env python3
"""Sender CPU per datagram of UDP sendmmsg with and without libzcnet_preload.so, by run
length: each call carries 64 datagrams of 1200 bytes to one receiver on loopback, cut into
runs of R equal datagrams (neighbouring runs differ in size, so a run is what GSO may
join). The library sends runs of at least GSO_MIN_RUN as one UDP GSO send each. Modes are
interleaved round by round; medians. The receiver (another process) counts what arrives
and checks every datagram's length and first bytes; losses on loopback are reported.

Usage: sendmmsg_gso.py LIBRARY [--calls N] [--rounds N]
"""

import argparse, ctypes, os, socket, statistics, struct, subprocess, sys, time

BATCH = 64


def sender(port, run, calls):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    class Msghdr(ctypes.Structure):
        _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.c_void_p),
                    ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p),
                    ("controllen", ctypes.c_size_t), ("flags", ctypes.c_int)]

    class Mmsghdr(ctypes.Structure):
        _fields_ = [("hdr", Msghdr), ("len", ctypes.c_uint)]

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    msgs, iovs, bufs = (Mmsghdr * BATCH)(), (Iovec * BATCH)(), []
    for i in range(BATCH):
        n = 1200 if (i // run) % 2 == 0 else 1100
        b = ctypes.create_string_buffer(bytes([i]) * n, n)
        bufs.append(b)
        iovs[i].base, iovs[i].len = ctypes.addressof(b), n
        msgs[i].hdr.iov = ctypes.addressof(iovs) + i * ctypes.sizeof(Iovec)
        msgs[i].hdr.iovlen = 1
    t = time.process_time()
    sent = 0
    for _ in range(calls):
        done = 0
        while done < BATCH:
            r = libc.sendmmsg(s.fileno(), ctypes.addressof(msgs) + done * ctypes.sizeof(Mmsghdr), BATCH - done, 0)
            if r < 0:
                raise SystemExit(f"sendmmsg errno {ctypes.get_errno()}")
            done += r
        sent += BATCH
        time.sleep(0)  # let the receiver drain
    print(time.process_time() - t, sent)


def main():
    if sys.argv[1:2] == ["--sender"]:
        return sender(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("library")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    modes = ["none", "lib"]
    print(f"{BATCH} datagrams per sendmmsg, {a.calls} calls, {a.rounds} rounds; sender CPU ns/datagram (median); shared machine")
    print(f"{'run':>4} {'none':>8} {'lib':>8} {'lib/none':>9} {'received':>9}")
    for run in (1, 2, 4, 8, 16, 64):
        per = {m: [] for m in modes}
        got = []
        for r in range(a.rounds):
            for m in modes[r % 2:] + modes[:r % 2]:
                rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                rx.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)
                rx.bind(("127.0.0.1", 0))
                env = dict(os.environ)
                env.pop("LD_PRELOAD", None)
                if m == "lib":
                    env["LD_PRELOAD"] = a.library
                p = subprocess.Popen([sys.executable, __file__, "--sender", str(rx.getsockname()[1]), str(run),
                                      str(a.calls)], env=env, stdout=subprocess.PIPE, text=True)
                rx.settimeout(20)  # the sender's start-up, then 0.5 s of silence ends it
                n = 0
                try:
                    while True:
                        d = rx.recv(65536)
                        rx.settimeout(0.5)
                        i = d[0]
                        want = 1200 if (i // run) % 2 == 0 else 1100
                        if len(d) != want or d != bytes([i]) * want:
                            raise SystemExit(f"run {run} {m}: a datagram of {len(d)} bytes, not {want}")
                        n += 1
                except socket.timeout:
                    pass
                out, _ = p.communicate()
                cpu, sent = out.split()
                per[m].append(float(cpu) * 1e9 / int(sent))
                got.append(n / int(sent))
                rx.close()
        med = {m: statistics.median(v) for m, v in per.items()}
        print(f"{run:4} {med['none']:8.0f} {med['lib']:8.0f} {med['lib'] / med['none']:9.3f} {min(got):9.3f}", flush=True)


if __name__ == "__main__":
    main()
