#!/usr/bin/env python3
"""How `zcnet bench -s` (iperf3 mode) holds against hostile iperf3-protocol clients, on
loopback: the figures behind tests/bench_server_bounds.rs, for any zcnet binary (so a
build before the bounds and one after can be compared).

  python3 bench/iperf3_server_bounds.py ZCNET memory P LEN N [SERVER OPTIONS…]
      N raw clients at once, each asking `-R -P P -l LEN` (bytes) and holding its data
      connections open, unread, for 2 s: the server's RSS before and its peak (VmHWM), its
      CPU seconds, what each client was answered, the log lines; then a real `iperf3 -c`.
  python3 bench/iperf3_server_bounds.py ZCNET emfile
      The server's soft descriptor limit set (prlimit) just above what it holds, 16 silent
      clients: its CPU seconds and log lines over 3 s at the limit; then a real `iperf3 -c`.

Mind the memory: a server without the bounds pre-faults P × 8 × LEN per client.
"""
import json, os, socket, struct, subprocess, sys, threading, time

BIN = sys.argv[1]
WHAT = sys.argv[2]

def start_server(extra=()):
    p = subprocess.Popen([BIN, "bench", "-s", "-B", "127.0.0.1:0", "-J", "--logfile", "/dev/null", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    port = int(line.split("127.0.0.1:")[1].split()[0])
    log = []
    def drain():
        for l in p.stderr:
            log.append(l)
    threading.Thread(target=drain, daemon=True).start()
    return p, port, log

def status(pid, field):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith(field + ":"):
            return int(l.split()[1]) * 1024
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100.0

n = [0]
def cookie():
    n[0] += 1
    return (f"{os.getpid():020d}{n[0]:016d}").encode() + b"\0"

def raw(port, params, conns, hold):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(60)
    ck = cookie(); c.sendall(ck)
    assert c.recv(1) == b"\x09"
    body = json.dumps(params).encode()
    c.sendall(struct.pack(">I", len(body)) + body)
    st = c.recv(1)
    data = []
    if st == b"\x0a":
        for _ in range(conns):
            d = socket.create_connection(("127.0.0.1", port)); d.sendall(ck); data.append(d)
        c.recv(1); c.recv(1)
        time.sleep(hold)
        res = "ran"
    elif st == b"\xff":
        res = "ACCESS_DENIED"
    elif st == b"\xfe":
        e = struct.unpack(">ii", c.recv(8))
        res = f"SERVER_ERROR {e[0]}"
    else:
        res = f"state {st!r}"
    for d in data: d.close()
    c.close()
    return res

def peak_watch(pid, stop, out):
    while not stop.is_set():
        try: out.append(status(pid, "VmRSS"))
        except Exception: break
        time.sleep(0.05)

if WHAT == "memory":
    P, L, N = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    extra = sys.argv[6:]
    p, port, log = start_server(extra)
    base = status(p.pid, "VmRSS"); c0 = cpu(p.pid); t0 = time.time()
    results = [None] * N
    def one(i):
        results[i] = raw(port, {"tcp": True, "time": 3, "parallel": P, "reverse": True, "len": L, "client_version": "3.12"}, P, 2.0)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in ts: t.start()
    for t in ts: t.join()
    time.sleep(0.5)
    hwm = status(p.pid, "VmHWM")
    from collections import Counter
    print(f"{N} clients x -R -P {P} -l {L>>20}M {' '.join(extra)}: RSS before {base>>20} MiB, peak (VmHWM) {hwm>>20} MiB, "
          f"CPU {cpu(p.pid)-c0:.2f} s in {time.time()-t0:.1f} s, answers {dict(Counter(results))}, log lines {len(log)}")
    # a real iperf3 afterwards
    time.sleep(1.0)
    r = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", "1", "-J"], capture_output=True, text=True)
    try:
        d = json.loads(r.stdout); print("iperf3 -c afterwards:", d.get("error") or f"ok, {d['end']['sum_received']['bits_per_second']/1e9:.2f} Gbit/s")
    except Exception as e:
        print("iperf3 -c afterwards: no JSON", r.stdout[:200], r.stderr[:200])
    p.kill(); p.wait()
elif WHAT == "emfile":
    p, port, log = start_server()
    nfd = len(os.listdir(f"/proc/{p.pid}/fd"))
    subprocess.run(["prlimit", "--pid", str(p.pid), f"--nofile={nfd+4}:"], check=True)
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
    time.sleep(0.3)
    l0 = len(log); b0 = sum(len(x) for x in log); c0 = cpu(p.pid); t0 = time.time()
    time.sleep(3)
    dt = time.time() - t0
    print(f"at the descriptor limit for {dt:.1f} s: CPU {cpu(p.pid)-c0:.2f} s, {len(log)-l0} log lines ({sum(len(x) for x in log)-b0} bytes); "
          f"server {'alive' if p.poll() is None else 'exited ' + str(p.returncode)}")
    for s in silent: s.close()
    subprocess.run(["prlimit", "--pid", str(p.pid), "--nofile=1024:"])
    time.sleep(1.5)
    r = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", "1", "-J"], capture_output=True, text=True)
    try:
        d = json.loads(r.stdout); print("iperf3 -c afterwards:", d.get("error") or "ok")
    except Exception:
        print("iperf3 -c afterwards: failed", r.stderr[:200])
    p.kill(); p.wait()
