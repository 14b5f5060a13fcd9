#!/usr/bin/env python3
"""CPU per GiB of unmodified programs with and without libzcnet_preload.so, side by side.

For each program pair (server, client) and each mode — `none` (no library), `copy`, `auto`,
`cow` (ZCNET_TX=zerocopy: every eligible span zero-copy under write protection) — runs one
transfer of SIZE bytes on loopback, interleaving modes round by round, and reports the
median over rounds of (user + system CPU of both processes) / GiB, from wait4(2)'s rusage.
Every transfer's bytes are checked (hash, or both ends' counts for iperf3).

Usage: cpu_per_gib.py LIBRARY [--size MiB] [--rounds N] [--only NAME...]
"""

import argparse, hashlib, json, os, signal, socket, statistics, subprocess, sys, tempfile, time

MODES = ["none", "copy", "auto", "cow"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def listening(port):
    want = "0100007F:%04X" % port
    with open("/proc/net/tcp") as f:
        return any(l.split()[1] == want and l.split()[3] == "0A" for l in f.readlines()[1:])


def env_for(mode, lib):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    if mode != "none":
        e["LD_PRELOAD"] = lib
        e["ZCNET_TX"] = {"cow": "zerocopy"}.get(mode, mode)
    return e


def start(cmd, env, **kw):
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, **kw)


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
            p.kill()
            raise RuntimeError(f"{p.args[0]} did not stop")
        time.sleep(0.01)


def wait_port(port, p):
    t = time.time()
    while not listening(port):
        if p.poll() is not None or time.time() - t > 20:
            raise RuntimeError("server did not listen")
        time.sleep(0.02)


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
            f"server {{ listen 127.0.0.1:{port}; root {d}; }} }}\n"
        )
    env = env_for(mode, lib)
    s = start(["nginx", "-e", f"{d}/error.log", "-c", conf], env)
    wait_port(port, s)
    out = os.path.join(d, "got.bin")
    c = start(["curl", "-sS", "--fail", "-o", out, f"http://127.0.0.1:{port}/data.bin"], env)
    cpu = reap(c)
    cpu += reap(s, signal.SIGQUIT)
    ok = c.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


def http_server(mode, lib, d, size, want):
    port = free_port()
    env = env_for(mode, lib)
    s = start([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", d],
              env, stderr=subprocess.DEVNULL)
    wait_port(port, s)
    out = os.path.join(d, "got.bin")
    c = start(["curl", "-sS", "--fail", "-o", out, f"http://127.0.0.1:{port}/data.bin"], env)
    cpu = reap(c)
    cpu += reap(s, signal.SIGINT)
    ok = c.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


def socat(mode, lib, d, size, want):
    port = free_port()
    env = env_for(mode, lib)
    out = os.path.join(d, "got.bin")
    r = start(["socat", "-b", "1048576", "-u", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr", f"CREATE:{out}"], env)
    wait_port(port, r)
    s = start(["socat", "-b", "1048576", "-u", f"OPEN:{d}/data.bin", f"TCP:127.0.0.1:{port}"], env)
    cpu = reap(s) + reap(r)
    ok = s.returncode == 0 and sha(out) == want
    os.unlink(out)
    return cpu, ok


def iperf3(mode, lib, d, size, want):
    port = str(free_port())
    env = env_for(mode, lib)
    s = subprocess.Popen(["iperf3", "-s", "-1", "-J", "-B", "127.0.0.1", "-p", port], env=env,
                         stdout=subprocess.PIPE)
    wait_port(int(port), s)
    c = subprocess.Popen(["iperf3", "-c", "127.0.0.1", "-p", port, "-J", "-l", "1M", "-n", str(size)],
                         env=env, stdout=subprocess.PIPE)
    cout = c.stdout.read()
    sout = s.stdout.read()
    cpu = reap(c) + reap(s)
    sent = json.loads(cout)["end"]["sum_sent"]["bytes"]
    got = json.loads(sout)["end"]["sum_received"]["bytes"]
    # iperf3's server stops counting at the end of the test, a little before the last bytes.
    return cpu, sent >= size and size // 2 <= got <= sent


PROGRAMS = {"nginx+curl": nginx, "http.server+curl": http_server, "socat": socat, "iperf3": iperf3}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("library")
    ap.add_argument("--size", type=int, default=1024, help="MiB per transfer")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    size = a.size << 20
    gib = size / (1 << 30)
    # tmpfs: no writeback of the received file charged to whichever run comes next.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as d:
        with open(os.path.join(d, "data.bin"), "wb") as f:
            block = os.urandom(1 << 20)
            for i in range(a.size):
                f.write(hashlib.sha256(i.to_bytes(8, "little")).digest() + block[32:])
        want = sha(os.path.join(d, "data.bin"))
        print(f"{a.size} MiB per transfer, {a.rounds} rounds, modes interleaved; CPU s/GiB, both processes")
        print(f"{'program':18} " + " ".join(f"{m:>8}" for m in MODES) + "   cow/none  auto/none")
        for name, fn in PROGRAMS.items():
            if a.only and name not in a.only:
                continue
            per = {m: [] for m in MODES}
            for r in range(a.rounds):
                for m in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:
                    cpu, ok = fn(m, a.library, d, size, want)
                    if not ok:
                        raise SystemExit(f"{name} {m}: transfer not verified")
                    per[m].append(cpu / gib)
            med = {m: statistics.median(v) for m, v in per.items()}
            print(f"{name:18} " + " ".join(f"{med[m]:8.3f}" for m in MODES)
                  + f"   {med['cow'] / med['none']:8.3f}  {med['auto'] / med['none']:8.3f}", flush=True)


if __name__ == "__main__":
    main()
