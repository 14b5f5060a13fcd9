#!/usr/bin/env python3
"""CPU per GiB of unmodified programs with and without libzcnet_preload.so, side by side.

For each program pair (server, client) and each mode — `none` (no library), `none2` (the
same, a second time: the sitting's own noise), `copy`, `auto`, `cow` (ZCNET_TX=zerocopy:
every eligible span zero-copy under write protection) — runs one transfer of SIZE bytes,
modes in a rotated order each round. A transfer's CPU is (user + system) of both processes
from wait4(2)'s rusage, less the server's CPU until it listens (its start-up is not per
GiB; read from /proc/PID/task/*/schedstat, in ns). Every transfer's bytes are checked
(hash, or both ends' counts for iperf3).

What is reported per mode is the median over rounds of that round's ratio mode/none (runs
of one round are seconds apart, so a slow stretch of a shared machine hits both ends of the
ratio), ± the half-width of its 95 % bootstrap interval. `none2/none` is what two identical
configurations show in the same sitting: a ratio whose distance from 1 is within that
column's is noise. With --pin (the default) the server runs on CPU 0 and the client on CPU 1
(taskset(1)): on a 2-CPU machine left to the scheduler, the two ends sometimes share a CPU
and sometimes not, and their CPU time differs by more than the library's. `softirq` is the
CPU the ksoftirqd threads took during the run — protocol work done outside both processes
and so not in their rusage; it is shown, not added (it also holds other programs' work).

Networks (--net): `loopback`, or `netns`: the server in one network namespace and the client
in another, joined by a veth pair this script creates (root; unique names, removed at exit).
`ip netns exec` and `taskset` exec the program, so wait4 still measures the program itself.

Usage: cpu_per_gib.py LIBRARY [--size MiB] [--rounds N] [--net loopback|netns|both]
                      [--only NAME...] [--modes MODE...] [--no-pin] [--raw FILE]
"""

import argparse, hashlib, json, os, random, signal, socket, statistics, subprocess, sys, tempfile, time


class Net:
    """Where the server and the client run."""

    def __init__(self, kind):
        self.kind = kind
        self.ns = None
        if kind == "netns":
            stem = f"zcb{os.getpid()}"
            self.ns = (f"{stem}a", f"{stem}b")
            a, b = self.ns
            cmds = [
                ["netns", "add", a], ["netns", "add", b],
                ["link", "add", "veth0", "netns", a, "type", "veth", "peer", "name", "veth1", "netns", b],
                ["-n", a, "addr", "add", "10.231.0.1/24", "dev", "veth0"],
                ["-n", b, "addr", "add", "10.231.0.2/24", "dev", "veth1"],
                ["-n", a, "link", "set", "lo", "up"], ["-n", b, "link", "set", "lo", "up"],
                ["-n", a, "link", "set", "veth0", "up"], ["-n", b, "link", "set", "veth1", "up"],
            ]
            try:
                for c in cmds:
                    subprocess.run(["ip"] + c, check=True)
            except BaseException:
                self.close()
                raise
        self.ip = "10.231.0.2" if self.ns else "127.0.0.1"

    def close(self):
        for n in self.ns or ():
            subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)

    def server(self, cmd):
        cmd = (["taskset", "-c", "0"] + cmd) if PIN else cmd
        return ["ip", "netns", "exec", self.ns[1]] + cmd if self.ns else cmd

    def client(self, cmd):
        cmd = (["taskset", "-c", "1"] + cmd) if PIN else cmd
        return ["ip", "netns", "exec", self.ns[0]] + cmd if self.ns else cmd

    def tcp_table(self):
        if not self.ns:
            with open("/proc/net/tcp") as f:
                return f.read()
        return subprocess.run(["ip", "netns", "exec", self.ns[1], "cat", "/proc/net/tcp"],
                              capture_output=True, text=True).stdout


NET = None
PIN = True

MODES = ["none", "none2", "copy", "auto", "cow"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def listening(port):
    want = "%08X:%04X" % (int.from_bytes(socket.inet_aton(NET.ip), "little"), port)
    return any(l.split()[1] == want and l.split()[3] == "0A" for l in NET.tcp_table().splitlines()[1:])


STATS = None


def env_for(mode, lib):
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "ZCNET_TX", "ZCNET_STATS"):
        e.pop(k, None)
    if not mode.startswith("none"):
        e["LD_PRELOAD"] = lib
        e["ZCNET_TX"] = {"cow": "zerocopy"}.get(mode, mode)
        e["ZCNET_STATS"] = STATS
    return e


def engine_stats():
    """Pages write-protected, write faults taken on them and the nanoseconds the engine
    spent resolving them, summed over the processes of the last run (their stats lines)."""
    pages = faults = fault_ns = 0
    try:
        with open(STATS) as f:
            for line in f:
                d = json.loads(line)
                pages += sum(s.get("pages_protected", 0) for s in d.get("sockets", []))
                pages += d.get("others", {}).get("pages_protected", 0)
                faults += d["engine"]["faults"] if d.get("engine") else 0
                fault_ns += d["engine"]["fault_ns"] if d.get("engine") else 0
        os.unlink(STATS)
    except FileNotFoundError:
        pass
    return pages, faults, fault_ns


def default_sigint():
    # A shell starts background jobs with SIGINT ignored, and Python then never installs its
    # handler: http.server would not stop on SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(cmd, env, **kw):
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, preexec_fn=default_sigint, **kw)


def reap(p, sig=None, timeout=60):
    """Stops p (with sig, if given) and returns its CPU seconds."""
    if sig is not None and p.poll() is None:
        p.send_signal(sig)
    deadline = time.time() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return ru.ru_utime + ru.ru_stime
        if time.time() > deadline:
            threads = []
            for t in sorted(os.listdir(f"/proc/{p.pid}/task")):
                try:
                    with open(f"/proc/{p.pid}/task/{t}/wchan") as w, open(f"/proc/{p.pid}/task/{t}/syscall") as c:
                        threads.append(f"{t}: {w.read()} {c.read().split()[0]}")
                except OSError:
                    pass
            p.kill()
            raise RuntimeError(f"{p.args} did not stop; threads (wchan, syscall nr): {threads}")
        time.sleep(0.01)


def task_cpu(pid):
    """CPU seconds the live threads of pid have run so far (schedstat: ns, not ticks)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9


def wait_port(port, p):
    """Waits until p listens on port; returns the CPU p took to get there."""
    t = time.time()
    while not listening(port):
        if p.poll() is not None or time.time() - t > 20:
            raise RuntimeError("server did not listen")
        time.sleep(0.02)
    return task_cpu(p.pid)


def softirqd():
    """The pids of the ksoftirqd threads."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().startswith("ksoftirqd/"):
                        pids.append(int(d))
            except OSError:
                pass
    return pids


SOFTIRQD = []


def softirq_cpu():
    return sum(task_cpu(p) for p in SOFTIRQD)


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def nginx(mode, lib, d, size, want):
    port = free_port()
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(
            f"daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n"
            f"error_log {d}/error.log;\nevents {{ worker_connections 64; }}\n"
            f"http {{ access_log off; sendfile off; output_buffers 2 1m;\n"
            f"client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n"
            f"uwsgi_temp_path {d}; scgi_temp_path {d};\n"
            f"server {{ listen {NET.ip}:{port}; root {d}; }} }}\n"
        )
    env = env_for(mode, lib)
    s = start(NET.server(["nginx", "-e", f"{d}/error.log", "-c", conf]), env)
    boot = wait_port(port, s)
    out = os.path.join(d, "got.bin")
    c = start(NET.client(["curl", "-sS", "--fail", "-o", out, f"http://{NET.ip}:{port}/data.bin"]), env)
    cpu = reap(c)
    cpu += reap(s, signal.SIGQUIT) - boot
    ok = c.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


def http_server(mode, lib, d, size, want):
    port = free_port()
    env = env_for(mode, lib)
    s = start(NET.server([sys.executable, "-m", "http.server", str(port), "--bind", NET.ip, "--directory", d]),
              env, stderr=subprocess.DEVNULL)
    boot = wait_port(port, s)
    out = os.path.join(d, "got.bin")
    c = start(NET.client(["curl", "-sS", "--fail", "-o", out, f"http://{NET.ip}:{port}/data.bin"]), env)
    cpu = reap(c)
    cpu += reap(s, signal.SIGINT) - boot
    ok = c.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


def socat(mode, lib, d, size, want):
    port = free_port()
    env = env_for(mode, lib)
    out = os.path.join(d, "got.bin")
    r = start(NET.server(["socat", "-b", "1048576", "-u", f"TCP-LISTEN:{port},bind={NET.ip},reuseaddr", f"CREATE:{out}"]), env)
    boot = wait_port(port, r)
    s = start(NET.client(["socat", "-b", "1048576", "-u", f"OPEN:{d}/data.bin", f"TCP:{NET.ip}:{port}"]), env)
    cpu = reap(s) + reap(r) - boot
    ok = s.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


def iperf3(mode, lib, d, size, want):
    port = str(free_port())
    env = env_for(mode, lib)
    s = subprocess.Popen(NET.server(["iperf3", "-s", "-1", "-J", "-B", NET.ip, "-p", port]), env=env,
                         stdout=subprocess.PIPE)
    boot = wait_port(int(port), s)
    c = subprocess.Popen(NET.client(["iperf3", "-c", NET.ip, "-p", port, "-J", "-l", "1M", "-n", str(size)]),
                         env=env, stdout=subprocess.PIPE)
    cout = c.stdout.read()
    sout = s.stdout.read()
    cpu = reap(c) + reap(s) - boot
    sent = json.loads(cout)["end"]["sum_sent"]["bytes"]
    got = json.loads(sout)["end"]["sum_received"]["bytes"]
    # iperf3's server stops counting at the end of the test, a little before the last bytes.
    return cpu, sent >= size and size // 2 <= got <= sent


PROGRAMS = {"nginx+curl": nginx, "http.server+curl": http_server, "socat": socat, "iperf3": iperf3}


def median_ci(v, draws=2000):
    """Half-width of a 95 % bootstrap interval of the median of v (fixed seed: a rerun of the
    same figures prints the same interval)."""
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(v, k=len(v))) for _ in range(draws))
    return (meds[int(draws * 0.975) - 1] - meds[int(draws * 0.025)]) / 2


def measure(name, fn, a, d, size, want):
    """Per mode: the median CPU s/GiB, and the median over rounds of the ratio to that
    round's `none` run; for `none2`, also the half-width of its ratio's interquartile range."""
    per = {m: [] for m in a.modes}
    soft = []
    cow = []
    gib = size / (1 << 30)
    for r in range(a.rounds):
        for m in a.modes[r % len(a.modes):] + a.modes[: r % len(a.modes)]:
            s0 = softirq_cpu()
            try:
                cpu, ok = fn(m, a.library, d, size, want)
            except RuntimeError as e:
                raise SystemExit(f"{name} {m} ({NET.kind}): {e}")
            if not ok:
                raise SystemExit(f"{name} {m} ({NET.kind}): transfer not verified")
            soft.append((softirq_cpu() - s0) / gib)
            per[m].append(cpu / gib)
            pages, faults, fault_ns = engine_stats()
            if m == "cow":
                cow.append((faults / max(pages, 1), fault_ns / max(faults, 1) / 1e3, fault_ns / 1e9 / gib))
            if a.raw:
                print(json.dumps({"program": name, "net": NET.kind, "round": r, "mode": m,
                                  "cpu": cpu / gib, "softirq": soft[-1], "pages": pages,
                                  "faults": faults, "fault_ns": fault_ns}), file=a.raw, flush=True)
    out = {"none": statistics.median(per["none"]), "softirq": statistics.median(soft)}
    for m in a.modes[1:]:
        ratios = [x / n for x, n in zip(per[m], per["none"])]
        out[m] = (statistics.median(ratios), median_ci(ratios))
    if cow:
        out["faulted"], out["us_fault"], out["fault_s"] = (statistics.median(c) for c in zip(*cow))
    return out


def main():
    global NET, PIN, SOFTIRQD, STATS
    # Stopped with SIGTERM: still remove the namespaces and the temporary files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("library")
    ap.add_argument("--size", type=int, default=1024, help="MiB per transfer")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--net", choices=["loopback", "netns", "both"], default="loopback")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--modes", nargs="*", default=MODES, help="none and none2 are always run")
    ap.add_argument("--raw", type=argparse.FileType("w"), help="write each run as a JSON line")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="let the scheduler place server and client")
    a = ap.parse_args()
    a.modes = ["none", "none2"] + [m for m in a.modes if m in MODES and not m.startswith("none")]
    PIN = a.pin
    SOFTIRQD = softirqd()
    size = a.size << 20
    nets = ["loopback", "netns"] if a.net == "both" else [a.net]
    # tmpfs: no writeback of the received file charged to whichever run comes next.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as d:
        STATS = os.path.join(d, "stats.jsonl")
        with open(os.path.join(d, "data.bin"), "wb") as f:
            block = os.urandom(1 << 20)
            for i in range(a.size):
                f.write(hashlib.sha256(i.to_bytes(8, "little")).digest() + block[32:])
        want = sha(os.path.join(d, "data.bin"))
        print(f"{a.size} MiB per transfer, {a.rounds} rounds, modes rotated, "
              f"{'server on CPU 0, client on CPU 1' if PIN else 'unpinned'}; CPU s/GiB of both "
              f"processes less the server's start-up; ratios: medians of per-round ratios to none")
        cow = "cow" in a.modes
        print(f"{'program':18} {'net':8} {'none':>7} {'softirq':>7} "
              + " ".join(f"{m + '/none':>13}" for m in a.modes[1:])
              + (f" {'faulted':>7} {'µs/flt':>6} {'flt s/GiB':>9}" if cow else ""))
        for kind in nets:
            NET = Net(kind)
            try:
                for name, fn in PROGRAMS.items():
                    if a.only and name not in a.only:
                        continue
                    med = measure(name, fn, a, d, size, want)
                    print(f"{name:18} {kind:8} {med['none']:7.3f} {med['softirq']:7.3f} "
                          + " ".join(f"{'%.3f±%.3f' % med[m]:>13}" for m in a.modes[1:])
                          + (f" {med['faulted']:7.1%} {med['us_fault']:6.1f} {med['fault_s']:9.3f}" if cow else ""),
                          flush=True)
            finally:
                NET.close()


if __name__ == "__main__":
    main()
