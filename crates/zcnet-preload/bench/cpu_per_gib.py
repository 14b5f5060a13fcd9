#!/usr/bin/env python3
"""CPU per GiB of unmodified programs with and without libzcnet_preload.so, side by side.

For each program pair (server, client) and each mode — `none` (no library), `none2` (the
same, a second time: the sitting's own noise), `copy`, `auto`, `cow` (ZCNET_TX=zerocopy:
every eligible span zero-copy under write protection) — runs one transfer of SIZE bytes,
modes in a rotated order each round. A transfer's CPU is (user + system) of both processes
from wait4(2)'s rusage, less the server's CPU until it listens (its start-up is not per
GiB; read from /proc/PID/task/*/schedstat, in ns); --raw lines hold each end's share too.
Every transfer's bytes are checked (hash; both ends' counts for iperf3; for redis the
stored value's length, redis-benchmark checking nothing).

Programs (--only): nginx+curl, http.server+curl (python3 -m http.server), socat, iperf3
(-c and -s), redis (redis-server and redis-benchmark, 1 MiB values, SIZE/2 SETs and as many
GETs: SIZE each way), rsync (a plain `rsync --daemon` on its own port, config in the
temporary directory, sending to an rsync client). All of them run under the library, in
both processes — the programs only, not the launch wrappers (`env LD_PRELOAD=… PROGRAM`
last in the chain, `env PROGRAM` for `none`): `zcnet run` loads it into the program alone.

What is reported per mode is an estimate (--estimator: median, geometric mean, or 20 %-trimmed
mean) over the ratios of mode to its reference `none` CPU, ± the half-width of its 95 %
interval. With --design rounds the reference is that round's `none` run; with --design
sandwich every run sits between two `none` runs and its reference is their mean: the runs
compared are adjacent, and a drift of the machine that is linear over the three runs
cancels. The same ratios of the runs' wall time follow the CPU columns (`w MODE/none`;
`wall` is none's, s/GiB, start-up included). `none2/none` is what two identical configurations show in the same sitting: a
ratio whose distance from 1 is within that column's is noise. --target H keeps adding rounds
after --rounds until every interval (forced `cow` aside) is at most ±H, for at most --budget
seconds per program and network; the rounds run are printed. --methods prints `none2/none`
by every accounting of a run's CPU (ACCOUNTS: both processes; with ksoftirqd; with every
kernel thread; all CPUs' busy time from /proc/stat) and every estimator, with and without
the ratios whose runs lost more than 1 % of a CPU to the hypervisor (steal, /proc/stat).

With --pin apart (the default) the server runs on CPU 0 and the client on CPU 1 (taskset(1)):
on a 2-CPU machine left to the scheduler, the two ends sometimes share a CPU and sometimes
not, and their CPU time differs by more than the library's; --pin same puts both on CPU 0.
--prio fifo runs both under SCHED_FIFO (chrt(1)), --prio nice at nice -20: other work on a
shared machine then waits instead of preempting them (its preemptions cost CPU: caches
refilled). `softirq` is the CPU the ksoftirqd threads took during the run — protocol work
done outside both processes and so not in their rusage; it is shown, not added (it also
holds other programs' work).

Networks (--net): `loopback`, or `netns`: the server in one network namespace and the client
in another, joined by a veth pair this script creates (root; unique names, removed at exit).
`ip netns exec` and `taskset` exec the program, so wait4 still measures the program itself.

Usage: cpu_per_gib.py LIBRARY [--size MiB] [--rounds N] [--net loopback|netns|both]
                      [--only NAME...] [--modes MODE...] [--no-pin] [--raw FILE]
                      [--pin apart|same|none] [--prio none|nice|fifo] [--design rounds|sandwich]
                      [--account proc|proc+softirq|proc+kthreads|system]
                      [--estimator median|gmean|trimmed] [--target H] [--budget S]
                      [--max-steal F] [--iperf3-scale K] [--methods]
"""

import argparse, hashlib, json, math, os, random, signal, socket, statistics, subprocess, sys, tempfile, time


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
        return self._wrap(cmd, "0", self.ns and self.ns[1])

    def client(self, cmd):
        return self._wrap(cmd, "0" if PIN == "same" else "1", self.ns and self.ns[0])

    @staticmethod
    def _wrap(cmd, cpu, ns):
        # Every wrapper execs the next, so wait4 still measures the program itself.
        cmd = PRIO + PRELOAD + cmd
        cmd = (["taskset", "-c", cpu] + cmd) if PIN != "none" else cmd
        return ["ip", "netns", "exec", ns] + cmd if ns else cmd

    def tcp_table(self):
        if not self.ns:
            with open("/proc/net/tcp") as f:
                return f.read()
        return subprocess.run(["ip", "netns", "exec", self.ns[1], "cat", "/proc/net/tcp"],
                              capture_output=True, text=True).stdout


NET = None
PIN = "apart"
PRIO = []

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


# What runs the measured program itself, after the wrappers (ip netns exec, taskset, chrt):
# `env` with the library's variables, or plain `env` for `none` (the same chain of execs).
PRELOAD = ["env"]


def env_for(mode, lib):
    """The environment of a run, without the library; sets PRELOAD, which puts the library
    in the program only — as `zcnet run` does — not in the wrappers, each of which would
    load it too (≈0.3 ms of CPU per process on this VM, in the program's rusage: wait4 sees
    the whole chain of execs)."""
    global PRELOAD
    e = dict(os.environ)
    for k in ("LD_PRELOAD", "ZCNET_TX", "ZCNET_STATS"):
        e.pop(k, None)
    PRELOAD = ["env"]
    if not mode.startswith("none"):
        PRELOAD += [f"LD_PRELOAD={lib}", "ZCNET_TX=" + {"cow": "zerocopy"}.get(mode, mode),
                    f"ZCNET_STATS={STATS}"]
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


# Voluntary and involuntary context switches of the processes reaped since the last reset:
# the second counts how often other work preempted the run.
SWITCHES = [0, 0]


def reap(p, sig=None, timeout=60):
    """Stops p (with sig, if given) and returns its CPU seconds."""
    if sig is not None and p.poll() is None:
        p.send_signal(sig)
    deadline = time.time() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            SWITCHES[0] += ru.ru_nvcsw
            SWITCHES[1] += ru.ru_nivcsw
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


# The server's and the client's CPU seconds in the last run (in the raw lines: which end
# a difference is in).
ENDS = [0.0, 0.0]


def ends(server, client):
    """Records the last run's CPU by end; returns their sum."""
    ENDS[:] = [server, client]
    return server + client


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
KTHREADS = []


def kthreads():
    """The pids of all kernel threads (children of kthreadd), taken once: workers that come
    and go later are missed."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == "2":
                        pids.append(int(d))
            except (OSError, IndexError):
                pass
    return pids


def cpu_of(pids):
    """pid → CPU seconds so far, of those of pids still alive."""
    out = {}
    for p in pids:
        try:
            out[p] = task_cpu(p)
        except OSError:
            pass
    return out


def grown(a, b):
    """CPU taken between two cpu_of readings, by the threads alive at both: one that
    exited in between would otherwise count negative."""
    return sum(b[p] - a[p] for p in a.keys() & b.keys())


def proc_stat():
    """Busy and steal seconds of all CPUs so far (/proc/stat, first line: USER_HZ ticks, so
    sampled at the tick — unbiased, but coarse over a short run)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def snapshot():
    busy, steal = proc_stat()
    return {"softirq": cpu_of(SOFTIRQD), "kthreads": cpu_of(KTHREADS), "system": busy,
            "steal": steal, "wall": time.monotonic()}


# What a run's CPU is, from its counters: both processes (wait4), plus ksoftirqd, plus every
# kernel thread, or every CPU's busy time (/proc/stat: holds whatever else the machine ran).
ACCOUNTS = {
    "proc": lambda r: r["proc"],
    "proc+softirq": lambda r: r["proc"] + r["softirq"],
    "proc+kthreads": lambda r: r["proc"] + r["kthreads"],
    "system": lambda r: r["system"],
}

# Not a CPU account: a run's wall time, the whole run — the server's start to the received
# bytes' check, so its fixed costs are in and a wall ratio sits nearer 1 than the transfer's
# own would. Printed beside the CPU columns (`wall`, `w MODE/none`), never an --account.
WALL = lambda r: r["wall"]


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
    client = reap(c)
    cpu = ends(reap(s, signal.SIGQUIT) - boot, client)
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
    client = reap(c)
    cpu = ends(reap(s, signal.SIGINT) - boot, client)
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
    client = reap(s)
    cpu = ends(reap(r) - boot, client)
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
    client = reap(c)
    cpu = ends(reap(s) - boot, client)
    sent = json.loads(cout)["end"]["sum_sent"]["bytes"]
    got = json.loads(sout)["end"]["sum_received"]["bytes"]
    # iperf3's server stops counting at the end of the test, a little before the last bytes.
    return cpu, sent >= size and size // 2 <= got <= sent


def redis(mode, lib, d, size, want):
    """redis-server and redis-benchmark, 1 MiB values: SIZE/2 SETs then SIZE/2 GETs (size
    MiB each way in all), four connections. redis-benchmark checks no value, so the stored
    value's length is checked afterwards (STRLEN: a few bytes, in the server's CPU)."""
    port = str(free_port())
    env = env_for(mode, lib)
    s = start(NET.server(["redis-server", "--port", port, "--bind", NET.ip, "--save", "",
                          "--appendonly", "no", "--protected-mode", "no", "--dir", d]), env)
    boot = wait_port(int(port), s)
    n = str(max(size >> 21, 1))
    c = subprocess.Popen(NET.client(["redis-benchmark", "-h", NET.ip, "-p", port, "-d", "1048576",
                                     "-n", n, "-c", "4", "-t", "set,get", "-q"]),
                         env=env, stdout=subprocess.PIPE, preexec_fn=default_sigint)
    out = c.stdout.read().decode(errors="replace")
    client = reap(c)
    length = subprocess.run(NET.client(["redis-cli", "-h", NET.ip, "-p", port, "STRLEN",
                                        "key:__rand_int__"]), capture_output=True, text=True).stdout
    cpu = ends(reap(s, signal.SIGTERM) - boot, client)
    ok = c.returncode == 0 and "SET:" in out and "GET:" in out and length.strip() == "1048576"
    return cpu, ok


def children(pid):
    """The pids of pid's children (every thread's)."""
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += f.read().split()
        except OSError:
            pass
    return out


def rsync(mode, lib, d, size, want):
    """A plain rsync daemon (`rsync --daemon`, config in the temporary directory) sends the
    file to an rsync client. The daemon forks a sender per connection; its CPU is in the
    daemon's rusage once the daemon has reaped it, which this waits for before stopping it."""
    port = str(free_port())
    env = env_for(mode, lib)
    conf = os.path.join(d, "rsyncd.conf")
    with open(conf, "w") as f:
        f.write(f"use chroot = no\nuid = 0\ngid = 0\npid file = {d}/rsyncd.pid\n"
                f"[src]\npath = {d}\nread only = yes\n")
    s = start(NET.server(["rsync", "--daemon", "--no-detach", "--address", NET.ip, "--port", port,
                          f"--config={conf}"]), env)
    boot = wait_port(int(port), s)
    dest = os.path.join(d, "dest")
    os.makedirs(dest, exist_ok=True)
    c = start(NET.client(["rsync", "-a", "--whole-file", f"rsync://{NET.ip}:{port}/src/data.bin", dest]), env)
    client = reap(c)
    t = time.time()
    while children(s.pid) and time.time() - t < 20:
        time.sleep(0.01)
    cpu = ends(reap(s, signal.SIGTERM) - boot, client)
    out = os.path.join(dest, "data.bin")
    ok = c.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


PROGRAMS = {"nginx+curl": nginx, "http.server+curl": http_server, "socat": socat, "iperf3": iperf3,
            "redis": redis, "rsync": rsync}


def bootstrap_ci(v, stat, draws=2000):
    """Half-width of a 95 % bootstrap interval of stat(v) (fixed seed: a rerun of the same
    figures prints the same interval)."""
    rng = random.Random(1)
    ts = sorted(stat(rng.choices(v, k=len(v))) for _ in range(draws))
    return (ts[int(draws * 0.975) - 1] - ts[int(draws * 0.025)]) / 2


def median_ci(v):
    return bootstrap_ci(v, statistics.median)


# Student's t, 97.5 % quantile, by degrees of freedom (beyond 30: 2.0 is within 2 %).
T975 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
        2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04]


def gmean_ci(v):
    """Geometric mean of the ratios v and the half-width of its 95 % t interval (on the logs:
    a ratio and its inverse are equally far from 1). More efficient than the median when the
    ratios are near log-normal, as they are without outliers."""
    logs = [math.log(x) for x in v if x > 0]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), float("nan")
    h = T975[min(len(logs) - 2, len(T975) - 1)] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), (math.exp(m + h) - math.exp(m - h)) / 2


def trimmed(v, cut=0.2):
    v = sorted(v)
    k = int(len(v) * cut)
    return statistics.fmean(v[k:len(v) - k])


def trimmed_ci(v):
    """The 20 %-trimmed mean of v, and the half-width of its 95 % bootstrap interval: robust to
    the odd run a burst of load slowed, nearly as efficient as the mean otherwise."""
    return trimmed(v), bootstrap_ci(v, trimmed)


ESTIMATORS = {
    "median": lambda v: (statistics.median(v), median_ci(v)),
    "gmean": gmean_ci,
    "trimmed": trimmed_ci,
}


def schedule(a, r, first):
    """The modes of round r, in the order they run. `rounds`: every mode once, rotated.
    `sandwich`: every mode's run sits between two `none` runs (shared with the neighbouring
    sandwiches; `first` opens the chain), modes rotated round by round — its ratio is to the
    mean of the two, which cancels a drift of the machine that is linear over three runs."""
    if a.design == "rounds":
        rot = r % len(a.modes)
        return a.modes[rot:] + a.modes[:rot]
    others = a.modes[1:]
    rot = r % len(others)
    order = ["none"] if first else []
    for m in others[rot:] + others[:rot]:
        order += [m, "none"]
    return order


def ratios(a, runs, mode, account, max_steal=None):
    """Per round (rounds) or per sandwich: mode's CPU over its reference `none` CPU; a ratio
    any of whose runs saw more than max_steal of a CPU stolen by the hypervisor is left out.
    account is a name in ACCOUNTS, or WALL: the transfer's wall time, by the same design."""
    acc = WALL if account is WALL else ACCOUNTS[account]
    stolen = lambda r: max_steal is not None and r["steal"] > max_steal * r["wall"]
    out = []
    if a.design == "rounds":
        nones = {r["round"]: r for r in runs if r["mode"] == "none"}
        for r in runs:
            if r["mode"] == mode and not (stolen(r) or stolen(nones[r["round"]])):
                out.append(acc(r) / acc(nones[r["round"]]))
    else:
        for i, r in enumerate(runs):
            if r["mode"] == mode and 0 < i < len(runs) - 1:
                b, c = runs[i - 1], runs[i + 1]
                if not (stolen(r) or stolen(b) or stolen(c)):
                    out.append(acc(r) / ((acc(b) + acc(c)) / 2))
    return out


def measure(name, fn, a, d, size, want):
    """Runs --rounds rounds, then more while a mode's interval (forced `cow` aside: it is
    not held to the 3 % goal) is wider than --target and --budget seconds have not passed;
    returns the runs, each with its counters (CPU seconds)."""
    runs = []
    gib = size / (1 << 30)
    t0 = time.monotonic()
    r = 0
    while r < a.rounds or (a.target and time.monotonic() - t0 < a.budget and wider(a, runs)):
        for m in schedule(a, r, not runs):
            s0 = snapshot()
            SWITCHES[:] = [0, 0]
            try:
                cpu, ok = fn(m, a.library, d, size, want)
            except RuntimeError as e:
                raise SystemExit(f"{name} {m} ({NET.kind}): {e}")
            if not ok:
                raise SystemExit(f"{name} {m} ({NET.kind}): transfer not verified")
            s1 = snapshot()
            run = {"program": name, "net": NET.kind, "round": r, "mode": m, "proc": cpu,
                   "server": ENDS[0], "client": ENDS[1],
                   "nvcsw": SWITCHES[0], "nivcsw": SWITCHES[1]}
            run.update({k: grown(s0[k], s1[k]) if isinstance(s0[k], dict) else s1[k] - s0[k]
                        for k in s0})
            run["pages"], run["faults"], run["fault_ns"] = engine_stats()
            run["gib"] = gib
            runs.append(run)
            if a.raw:
                print(json.dumps(run), file=a.raw, flush=True)
        r += 1
    return runs


def wider(a, runs):
    """Whether some mode's interval is still wider than the target."""
    for m in a.modes[1:]:
        if m != "cow":
            v = ratios(a, runs, m, a.account, a.max_steal)
            if len(v) < 3 or ESTIMATORS[a.estimator](v)[1] > a.target:
                return True
    return False


def summary(a, runs):
    """Per mode: the median CPU s/GiB of `none`, ksoftirqd's, and each mode's ratio with the
    half-width of its 95 % interval, by the chosen accounting and estimator; the same for the
    transfer's wall time (`wall`, `wall:MODE`)."""
    gib = runs[0]["gib"]
    acc = ACCOUNTS[a.account]
    out = {"none": statistics.median(acc(r) / gib for r in runs if r["mode"] == "none"),
           "softirq": statistics.median(r["softirq"] / gib for r in runs),
           "wall": statistics.median(WALL(r) / gib for r in runs if r["mode"] == "none")}
    nan = (float("nan"), float("nan"))
    for m in a.modes[1:]:
        v = ratios(a, runs, m, a.account, a.max_steal)
        out[m] = ESTIMATORS[a.estimator](v) if v else nan
        v = ratios(a, runs, m, WALL, a.max_steal)
        out["wall:" + m] = ESTIMATORS[a.estimator](v) if v else nan
    cow = [(r["faults"] / max(r["pages"], 1), r["fault_ns"] / max(r["faults"], 1) / 1e3,
            r["fault_ns"] / 1e9 / gib) for r in runs if r["mode"] == "cow"]
    if cow:
        out["faulted"], out["us_fault"], out["fault_s"] = (statistics.median(c) for c in zip(*cow))
    return out


def methods(a, runs):
    """What each accounting and estimator makes of the same runs' `none2/none`: the method
    whose interval is narrowest resolves the smallest difference."""
    lines = []
    for steal in (None, 0.01):
        for acc in ACCOUNTS:
            v = ratios(a, runs, "none2", acc, steal)
            if len(v) < 3:
                continue
            cells = " ".join("%s %.3f±%.3f" % ((e,) + ESTIMATORS[e](v)) for e in ESTIMATORS)
            sd = statistics.stdev(math.log(x) for x in v if x > 0)
            lines.append(f"    none2/none {acc:14} {'steal≤1%' if steal else 'all':8} n={len(v):3} "
                         f"sd {sd:5.3f}  {cells}")
    return "\n".join(lines)


def main():
    global NET, PIN, PRIO, SOFTIRQD, KTHREADS, STATS
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
    ap.add_argument("--pin", choices=["apart", "same", "none"], default="apart",
                    help="server on CPU 0 and client on CPU 1, both on CPU 0, or left to the scheduler")
    ap.add_argument("--no-pin", dest="pin", action="store_const", const="none",
                    help="the same as --pin none")
    ap.add_argument("--prio", choices=["none", "nice", "fifo"], default="none",
                    help="run both programs at nice -20, or SCHED_FIFO 10: the machine's other "
                         "work then waits rather than interleaving with theirs")
    ap.add_argument("--design", choices=["rounds", "sandwich"], default="rounds",
                    help="rounds: every mode once per round, ratio to the round's none; "
                         "sandwich: every run between two none runs, ratio to their mean")
    ap.add_argument("--account", choices=list(ACCOUNTS), default="proc",
                    help="what a run's CPU is (see ACCOUNTS)")
    ap.add_argument("--estimator", choices=list(ESTIMATORS), default="median")
    ap.add_argument("--max-steal", type=float,
                    help="leave out ratios with a run that lost more than this share of a CPU to steal")
    ap.add_argument("--target", type=float,
                    help="after --rounds, add rounds until every interval's half-width is at most this")
    ap.add_argument("--budget", type=float, default=120,
                    help="seconds per program and network beyond which --target adds no round")
    ap.add_argument("--iperf3-scale", type=int, default=1,
                    help="iperf3 moves this many times --size (it spends 4x less CPU per byte)")
    ap.add_argument("--methods", action="store_true",
                    help="also print none2/none by every accounting and estimator")
    a = ap.parse_args()
    a.modes = ["none", "none2"] + [m for m in a.modes if m in MODES and not m.startswith("none")]
    PIN = a.pin
    PRIO = {"none": [], "nice": ["nice", "-n", "-20"], "fifo": ["chrt", "-f", "10"]}[a.prio]
    SOFTIRQD = softirqd()
    KTHREADS = kthreads()
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
        place = {"apart": "server on CPU 0, client on CPU 1", "same": "both on CPU 0",
                 "none": "unpinned"}[PIN]
        print(f"{a.size} MiB per transfer, {a.rounds} rounds, design {a.design}, {place}, "
              f"priority {a.prio}; CPU s/GiB ({a.account}) less the server's start-up; "
              f"ratios: {a.estimator} of per-{'round' if a.design == 'rounds' else 'sandwich'} "
              f"ratios to none ± 95 % half-width" + (f", steal ≤ {a.max_steal:.0%}" if a.max_steal else ""))
        cow = "cow" in a.modes
        print(f"{'program':18} {'net':8} {'none':>7} {'softirq':>7} "
              + " ".join(f"{m + '/none':>13}" for m in a.modes[1:])
              + (f" {'faulted':>7} {'µs/flt':>6} {'flt s/GiB':>9}" if cow else "")
              + f"  {'wall':>6} " + " ".join(f"{'w ' + m + '/none':>13}" for m in a.modes[1:]),
              flush=True)
        for kind in nets:
            NET = Net(kind)
            try:
                for name, fn in PROGRAMS.items():
                    if a.only and name not in a.only:
                        continue
                    t0 = time.monotonic()
                    n = size * a.iperf3_scale if name == "iperf3" else size
                    runs = measure(name, fn, a, d, n, want)
                    med = summary(a, runs)
                    print(f"{name:18} {kind:8} {med['none']:7.3f} {med['softirq']:7.3f} "
                          + " ".join(f"{'%.3f±%.3f' % med[m]:>13}" for m in a.modes[1:])
                          + (f" {med['faulted']:7.1%} {med['us_fault']:6.1f} {med['fault_s']:9.3f}" if cow else "")
                          + f"  {med['wall']:6.3f} "
                          + " ".join(f"{'%.3f±%.3f' % med['wall:' + m]:>13}" for m in a.modes[1:])
                          + f"  ({1 + runs[-1]['round']} rounds, {time.monotonic() - t0:.0f} s)", flush=True)
                    if a.methods:
                        print(methods(a, runs), flush=True)
            finally:
                NET.close()


if __name__ == "__main__":
    main()
