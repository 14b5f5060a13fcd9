#!/usr/bin/env python3
"""What forced `cow` costs per fault, by where the engine's fault-handler thread runs.

socat sends a file to socat over loopback, the receiver (no library) on CPU 0 and the
sender (ZCNET_TX=zerocopy) on CPU 1. As soon as the sender's `zcnet-cow` thread appears it
is moved (sched_setaffinity) to the sender's CPU (`same`) or to the other one (`other`).
Pairs interleaved; per placement the medians of the sender's CPU (wait4 rusage), the share
of protected pages the program wrote while still protected, and the engine's µs per fault
(its ZCNET_STATS line). Every transfer is compared byte for byte.

Usage: cow_handler_cpu.py LIBRARY [--size MiB] [--pairs N]
"""

import argparse, json, os, socket, statistics, subprocess, tempfile, time


def listening(port):
    with open("/proc/net/tcp") as f:
        return any(l.split()[1] == "0100007F:%04X" % port and l.split()[3] == "0A"
                   for l in f.read().splitlines()[1:])


def run(lib, d, data, where):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    stats, out = os.path.join(d, "stats.jsonl"), os.path.join(d, "got.bin")
    for f in (stats, out):
        if os.path.exists(f):
            os.unlink(f)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ZCNET_TX", "ZCNET_STATS")}
    r = subprocess.Popen(["taskset", "-c", "0", "socat", "-b", "1048576", "-u",
                          f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr", f"CREATE:{out}"], env=env)
    t = time.time()
    while not listening(port):
        if r.poll() is not None or time.time() - t > 10:
            raise SystemExit("receiver did not listen")
        time.sleep(0.005)
    env.update(LD_PRELOAD=lib, ZCNET_TX="zerocopy", ZCNET_STATS=stats)
    c = subprocess.Popen(["taskset", "-c", "1", "socat", "-b", "1048576", "-u", f"OPEN:{data}",
                          f"TCP:127.0.0.1:{port}"], env=env)
    moved = False
    while not moved and c.poll() is None:
        try:
            for tid in os.listdir(f"/proc/{c.pid}/task"):
                with open(f"/proc/{c.pid}/task/{tid}/comm") as f:
                    if f.read().strip() == "zcnet-cow":
                        os.sched_setaffinity(int(tid), {1 if where == "same" else 0})
                        moved = True
        except OSError:
            pass
        time.sleep(0.0005)
    _, status, ru = os.wait4(c.pid, 0)
    if r.wait(60) != 0 or status != 0:
        raise SystemExit("socat failed")
    with open(out, "rb") as a, open(data, "rb") as b:
        if a.read() != b.read():
            raise SystemExit("received bytes differ")
    with open(stats) as f:
        line = json.loads(f.readline())
    e = line["engine"]
    pages = sum(s["pages_protected"] for s in line["sockets"])
    if not moved or not e["faults"]:
        raise SystemExit("the handler was not moved in time (or no fault): use a larger --size")
    return ru.ru_utime + ru.ru_stime, e["faults"] / pages, e["fault_ns"] / e["faults"] / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("library")
    ap.add_argument("--size", type=int, default=64, help="MiB per transfer")
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        data = os.path.join(d, "data.bin")
        with open(data, "wb") as f:
            f.write(os.urandom(a.size << 20))
        res = {"same": [], "other": []}
        for _ in range(a.pairs):
            for w in res:
                res[w].append(run(a.library, d, data, w))
        print(f"{a.size} MiB, {a.pairs} interleaved pairs; medians")
        for w, v in res.items():
            cpu, faulted, us = (statistics.median(x) for x in zip(*v))
            print(f"handler on the {w:5} CPU: sender CPU {cpu:.3f} s, faulted {faulted:.1%}, "
                  f"{us:.1f} µs per fault")


if __name__ == "__main__":
    main()
