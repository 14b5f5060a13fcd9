#!/usr/bin/env python3
"""Unmodified programs under `zcnet run`, in every mode, on loopback and across two network
namespaces, in one sitting: one row per program × net × mode, with whether every byte arrived
(checked by hash; iperf3, whose data is random, by its own counts) and what the library did
— bytes sent by copy and zero-copy, bytes the kernel copied anyway (COPIED completions),
protection faults, receives detoured around protected memory, fallbacks by reason — added up
over the stats lines of every process of the row (both ends run under the library).

This is issue 42's table ("the programs above rerun in every mode, byte-exact"): a check of
behaviour, not of speed, so it may run on a busy machine. Its CPU sibling is cpu_per_gib.py.

Programs (--only; each is skipped, and said so, when a command it needs is missing; --install
apt-installs them first): nginx, lighttpd (sendfile and writev), python http.server, node,
haproxy (TCP proxy in front of python's http.server), socat, nc (OpenBSD), ncat, memcached
(1 MiB values), redis (1 MiB values), rsync (daemon), iperf3, sshd+scp, openssl s_server (-WWW,
fetched by curl), git daemon (clone), asyncio (a server writing with writelines).

Modes (--modes): none (no library), copy, auto, zerocopy, cow. Networks (--net): loopback,
netns (the server in one namespace, the client in another, a veth pair between: root; unique
names, removed at exit).

Usage: programs.py [--zcnet PATH] [--size MiB] [--net loopback netns] [--modes ...]
                   [--only NAME...] [--install] [--local-zerocopy] [--json FILE]
"""

import argparse, hashlib, json, os, shutil, signal, socket, subprocess, sys, tempfile, time

APT = {
    "nginx": "nginx-light", "lighttpd": "lighttpd", "curl": "curl", "node": "nodejs",
    "haproxy": "haproxy", "socat": "socat", "nc": "netcat-openbsd", "ncat": "ncat",
    "memcached": "memcached", "redis-server": "redis-server", "rsync": "rsync",
    "iperf3": "iperf3", "scp": "openssh-client", "/usr/sbin/sshd": "openssh-server",
    "openssl": "openssl", "git": "git", "ss": "iproute2",
}


def have(cmd):
    return os.path.exists(cmd) if cmd.startswith("/") else shutil.which(cmd) is not None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


class Net:
    """Where the server and the client run, and their addresses."""

    def __init__(self, kind):
        self.kind = kind
        self.ns = None
        if kind == "loopback":
            self.srv_ip = self.cli_ip = "127.0.0.1"
            return
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"zpgA{tag}", f"zpgB{tag}")
        a, b = self.ns
        third = 100 + os.getpid() % 150
        self.srv_ip, self.cli_ip = f"10.231.{third}.1", f"10.231.{third}.2"
        cmds = [
            ["ip", "netns", "add", a], ["ip", "netns", "add", b],
            ["ip", "link", "add", f"zpg{tag}a", "netns", a, "type", "veth", "peer", "name", f"zpg{tag}b", "netns", b],
            ["ip", "-n", a, "addr", "add", f"{self.srv_ip}/24", "dev", f"zpg{tag}a"],
            ["ip", "-n", b, "addr", "add", f"{self.cli_ip}/24", "dev", f"zpg{tag}b"],
            ["ip", "-n", a, "link", "set", f"zpg{tag}a", "up"], ["ip", "-n", b, "link", "set", f"zpg{tag}b", "up"],
            ["ip", "-n", a, "link", "set", "lo", "up"], ["ip", "-n", b, "link", "set", "lo", "up"],
        ]
        for c in cmds:
            subprocess.run(c, check=True)

    def srv(self, argv):
        return (["ip", "netns", "exec", self.ns[0]] if self.ns else []) + argv

    def cli(self, argv):
        return (["ip", "netns", "exec", self.ns[1]] if self.ns else []) + argv

    def listening(self, port):
        out = subprocess.run(self.srv(["ss", "-Hltn", f"sport = :{port}"]), capture_output=True, text=True).stdout
        return bool(out.strip())

    def close(self):
        if self.ns:
            for n in self.ns:
                subprocess.run(["ip", "netns", "del", n], stderr=subprocess.DEVNULL)
            self.ns = None


class Row:
    """One program × net × mode: its processes, its directory, and how they are wrapped."""

    def __init__(self, args, net, mode, work, data, digest):
        self.args, self.net, self.mode, self.data, self.digest = args, net, mode, data, digest
        self.dir = tempfile.mkdtemp(dir=work)
        self.stats = os.path.join(self.dir, "stats.jsonl")
        self.port = free_port()
        self.procs = []

    def wrap(self, argv):
        if self.mode == "none":
            return argv
        return [self.args.zcnet, "run", "--tx", self.mode, "--stats", self.stats, "--"] + argv

    def env(self):
        e = dict(os.environ)
        if self.args.local_zerocopy:
            e["ZCNET_LOCAL_ZEROCOPY"] = "1"
        return e

    def server(self, argv, port=None, cwd=None, wait=True):
        p = subprocess.Popen(self.net.srv(self.wrap(argv)), cwd=cwd or self.dir, env=self.env(),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(self.dir, "server.err"), "ab"), start_new_session=True)
        self.procs.append(p)
        if wait:
            port = port or self.port
            t = time.time()
            while not self.net.listening(port):
                if p.poll() is not None or time.time() - t > 15:
                    raise RuntimeError(f"server did not listen on {port}: {self.err('server')}")
                time.sleep(0.05)
        return p

    def client(self, argv, stdin=None, stdout=None, timeout=120):
        with open(os.path.join(self.dir, "client.err"), "ab") as err:
            r = subprocess.run(self.net.cli(self.wrap(argv)), cwd=self.dir, env=self.env(),
                               stdin=stdin or subprocess.DEVNULL, stdout=stdout or subprocess.DEVNULL,
                               stderr=err, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"client exited {r.returncode}: {self.err('client')}")

    def err(self, who):
        try:
            with open(os.path.join(self.dir, f"{who}.err"), errors="replace") as f:
                return f.read()[-400:].strip()
        except OSError:
            return ""

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def lines(self):
        try:
            with open(self.stats) as f:
                return [json.loads(l) for l in f if l.strip()]
        except OSError:
            return []

    def same(self, path):
        return os.path.exists(path) and sha(path) == self.digest

    def url(self, name="data.bin", scheme="http", port=None):
        return f"{scheme}://{self.net.srv_ip}:{port or self.port}/{name}"


def served_dir(row):
    d = os.path.join(row.dir, "www")
    os.makedirs(d)
    shutil.copy(row.data, os.path.join(d, "data.bin"))
    return d


def curl_check(row, url, extra=()):
    out = os.path.join(row.dir, "got.bin")
    row.client(["curl", "-sSf", *extra, "-o", out, url])
    return row.same(out)


# ---- the programs: each returns True when every byte arrived ----

def p_nginx(row):
    www = served_dir(row)
    conf = os.path.join(row.dir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1; pid {row.dir}/nginx.pid;
error_log {row.dir}/nginx.log; events {{ worker_connections 64; }}
http {{ access_log off; sendfile off; client_body_temp_path {row.dir}; proxy_temp_path {row.dir};
fastcgi_temp_path {row.dir}; uwsgi_temp_path {row.dir}; scgi_temp_path {row.dir};
server {{ listen {row.net.srv_ip}:{row.port}; root {www}; }} }}
""")
    row.server(["nginx", "-c", conf, "-p", row.dir])
    return curl_check(row, row.url())


def p_lighttpd(row):
    www = served_dir(row)
    conf = os.path.join(row.dir, "lighttpd.conf")
    with open(conf, "w") as f:
        f.write(f'server.document-root = "{www}"\nserver.port = {row.port}\nserver.bind = "{row.net.srv_ip}"\n'
                f'server.errorlog = "{row.dir}/lighttpd.log"\nserver.modules = ()\n')
    row.server(["lighttpd", "-D", "-f", conf])
    return curl_check(row, row.url())


def p_http_server(row):
    www = served_dir(row)
    row.server(["python3", "-m", "http.server", "-b", row.net.srv_ip, "-d", www, str(row.port)])
    return curl_check(row, row.url())


def p_node(row):
    js = (f"const fs=require('fs'),http=require('http');const b=fs.readFileSync({json.dumps(row.data)});"
          f"http.createServer((q,s)=>{{s.writeHead(200,{{'content-length':b.length}});s.end(b)}})"
          f".listen({row.port},{json.dumps(row.net.srv_ip)});")
    row.server(["node", "-e", js])
    return curl_check(row, row.url())


def p_haproxy(row):
    www = served_dir(row)
    back = free_port()
    row.server(["python3", "-m", "http.server", "-b", "127.0.0.1", "-d", www, str(back)], port=back)
    conf = os.path.join(row.dir, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""global
  maxconn 64
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend f
  bind {row.net.srv_ip}:{row.port}
  default_backend b
backend b
  server s1 127.0.0.1:{back}
""")
    row.server(["haproxy", "-db", "-f", conf])
    return curl_check(row, row.url())


def p_socat(row):
    out = os.path.join(row.dir, "got.bin")
    srv = row.server(["socat", "-u", f"TCP-LISTEN:{row.port},bind={row.net.srv_ip},reuseaddr", f"CREATE:{out}"])
    row.client(["socat", "-u", f"OPEN:{row.data}", f"TCP:{row.net.srv_ip}:{row.port}"])
    srv.wait(timeout=60)
    return row.same(out)


def pipe_through(row, listen, send):
    """A listener writing what it receives to got.bin, and a sender reading the data file on
    its standard input (nc, ncat)."""
    out = os.path.join(row.dir, "got.bin")
    with open(out, "wb") as o:
        srv = subprocess.Popen(row.net.srv(row.wrap(listen)), stdout=o, stdin=subprocess.DEVNULL,
                               env=row.env(), start_new_session=True)
    row.procs.append(srv)
    t = time.time()
    while not row.net.listening(row.port):
        if srv.poll() is not None or time.time() - t > 15:
            raise RuntimeError(f"{listen[0]} did not listen")
        time.sleep(0.05)
    with open(row.data, "rb") as i:
        row.client(send, stdin=i)
    srv.wait(timeout=60)
    return row.same(out)


def p_nc(row):
    ip, port = row.net.srv_ip, str(row.port)
    return pipe_through(row, ["nc", "-l", ip, port], ["nc", "-N", ip, port])


def p_ncat(row):
    ip, port = row.net.srv_ip, str(row.port)
    return pipe_through(row, ["ncat", "-l", ip, port, "--recv-only"], ["ncat", "--send-only", ip, port])


# A client of a key-value server, in Python under the library too: stores the data in 1 MiB
# values, reads them back, and writes what it read to got.bin.
KV_CLIENT = r"""
import socket, sys
proto, host, port, src, dst = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
data = open(src, 'rb').read()
vals = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
s = socket.create_connection((host, port)); f = s.makefile('rb')
def line():
    l = f.readline()
    if not l: raise SystemExit('connection closed')
    return l
for i, v in enumerate(vals):
    if proto == 'redis':
        s.sendall(b'*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$%d\r\n' % (len(b'k%d' % i), i, len(v)) + v + b'\r\n')
        assert line() == b'+OK\r\n'
    else:
        s.sendall(b'set k%d 0 0 %d\r\n' % (i, len(v)) + v + b'\r\n')
        assert line() == b'STORED\r\n', 'store refused'
out = open(dst, 'wb')
for i in range(len(vals)):
    if proto == 'redis':
        s.sendall(b'*2\r\n$3\r\nGET\r\n$%d\r\nk%d\r\n' % (len(b'k%d' % i), i))
        n = int(line()[1:])
        out.write(f.read(n)); f.read(2)
    else:
        s.sendall(b'get k%d\r\n' % i)
        n = int(line().split()[3])
        out.write(f.read(n)); f.read(2); assert line() == b'END\r\n'
"""


def p_memcached(row):
    row.server(["memcached", "-u", "root", "-l", row.net.srv_ip, "-p", str(row.port), "-U", "0", "-I", "2m", "-m", "1024"])
    out = os.path.join(row.dir, "got.bin")
    row.client(["python3", "-c", KV_CLIENT, "memcached", row.net.srv_ip, str(row.port), row.data, out])
    return row.same(out)


def p_redis(row):
    row.server(["redis-server", "--port", str(row.port), "--bind", row.net.srv_ip, "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--dir", row.dir])
    out = os.path.join(row.dir, "got.bin")
    row.client(["python3", "-c", KV_CLIENT, "redis", row.net.srv_ip, str(row.port), row.data, out])
    return row.same(out)


def p_rsync(row):
    dst = os.path.join(row.dir, "dst")
    os.makedirs(dst)
    conf = os.path.join(row.dir, "rsyncd.conf")
    with open(conf, "w") as f:
        f.write(f"use chroot = no\nuid = 0\ngid = 0\npid file = {row.dir}/rsyncd.pid\n[dst]\npath = {dst}\nread only = no\n")
    row.server(["rsync", "--daemon", "--no-detach", f"--address={row.net.srv_ip}", f"--port={row.port}", f"--config={conf}"])
    row.client(["rsync", "--whole-file", row.data, f"rsync://{row.net.srv_ip}:{row.port}/dst/"])
    return row.same(os.path.join(dst, os.path.basename(row.data)))


def p_iperf3(row):
    size = os.path.getsize(row.data)
    srv = row.server(["iperf3", "-s", "-1", "-B", row.net.srv_ip, "-p", str(row.port), "-J",
                      "--logfile", os.path.join(row.dir, "srv.json")])
    out = os.path.join(row.dir, "cli.json")
    with open(out, "wb") as o:
        row.client(["iperf3", "-c", row.net.srv_ip, "-p", str(row.port), "-n", str(size), "-J"], stdout=o)
    srv.wait(timeout=30)
    sent = json.load(open(out))["end"]["sum_sent"]["bytes"]
    got = json.load(open(os.path.join(row.dir, "srv.json")))["end"]["sum_received"]["bytes"]
    # iperf3's data is random and unchecked, and its server stops counting when the test
    # ends, a little before the last bytes arrive (without the library too): the counts are
    # what iperf3 can vouch for.
    return sent >= size and sent / 2 <= got <= sent


def p_scp(row):
    d = os.path.join(row.dir, "ssh")
    os.makedirs(d)
    os.makedirs("/run/sshd", exist_ok=True)
    for k in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, k)], check=True)
    shutil.copy(os.path.join(d, "client_key.pub"), os.path.join(d, "authorized_keys"))
    conf = os.path.join(d, "sshd_config")
    with open(conf, "w") as f:
        f.write(f"ListenAddress {row.net.srv_ip}\nPort {row.port}\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                f"StrictModes no\nSubsystem sftp /usr/lib/openssh/sftp-server\nPidFile {d}/sshd.pid\n")
    row.server(["/usr/sbin/sshd", "-D", "-e", "-f", conf])
    out = os.path.join(row.dir, "got.bin")
    opts = ["-q", "-i", f"{d}/client_key", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-P", str(row.port)]
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    row.client(["scp", *opts, row.data, f"{user}@{row.net.srv_ip}:{out}"])
    ok = row.same(out)
    os.unlink(out)
    row.client(["scp", *opts, f"{user}@{row.net.srv_ip}:{row.data}", out])
    return ok and row.same(out)


def p_openssl(row):
    www = served_dir(row)
    key, crt = os.path.join(row.dir, "k.pem"), os.path.join(row.dir, "c.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=zcnet"], check=True, capture_output=True)
    row.server(["openssl", "s_server", "-WWW", "-accept", f"{row.net.srv_ip}:{row.port}", "-key", key, "-cert", crt, "-quiet"],
               cwd=www)
    return curl_check(row, row.url(scheme="https"), extra=("-k",))


def p_git(row):
    repo = os.path.join(row.dir, "base", "repo")
    os.makedirs(repo)
    g = ["git", "-c", "user.name=z", "-c", "user.email=z@z", "-C", repo]
    subprocess.run(["git", "init", "-q", repo], check=True)
    shutil.copy(row.data, os.path.join(repo, "data.bin"))
    subprocess.run(g + ["add", "data.bin"], check=True)
    subprocess.run(g + ["commit", "-qm", "data"], check=True)
    row.server(["git", "daemon", "--export-all", f"--base-path={row.dir}/base", f"--listen={row.net.srv_ip}",
                f"--port={row.port}", "--reuseaddr"])
    out = os.path.join(row.dir, "clone")
    row.client(["git", "clone", "-q", f"git://{row.net.srv_ip}:{row.port}/repo", out])
    return row.same(os.path.join(out, "data.bin"))


ASYNCIO_SERVER = r"""
import asyncio, sys
host, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(src, 'rb').read()
async def serve(r, w):
    w.writelines([data[i:i + (256 << 10)] for i in range(0, len(data), 256 << 10)])
    await w.drain(); w.close(); await w.wait_closed()
async def main():
    s = await asyncio.start_server(serve, host, port)
    async with s: await s.serve_forever()
asyncio.run(main())
"""
READ_ALL = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); out = open(sys.argv[3], 'wb')
while True:
    b = s.recv(1 << 20)
    if not b: break
    out.write(b)
"""


def p_asyncio(row):
    row.server(["python3", "-c", ASYNCIO_SERVER, row.net.srv_ip, str(row.port), row.data])
    out = os.path.join(row.dir, "got.bin")
    row.client(["python3", "-c", READ_ALL, row.net.srv_ip, str(row.port), out])
    return row.same(out)


PROGRAMS = {
    "nginx": (p_nginx, ["nginx", "curl"]),
    "lighttpd": (p_lighttpd, ["lighttpd", "curl"]),
    "http.server": (p_http_server, ["python3", "curl"]),
    "node": (p_node, ["node", "curl"]),
    "haproxy": (p_haproxy, ["haproxy", "python3", "curl"]),
    "socat": (p_socat, ["socat"]),
    "nc": (p_nc, ["nc"]),
    "ncat": (p_ncat, ["ncat"]),
    "memcached": (p_memcached, ["memcached", "python3"]),
    "redis": (p_redis, ["redis-server", "python3"]),
    "rsync": (p_rsync, ["rsync"]),
    "iperf3": (p_iperf3, ["iperf3"]),
    "scp": (p_scp, ["scp", "/usr/sbin/sshd", "ssh-keygen"]),
    "openssl": (p_openssl, ["openssl", "curl"]),
    "git": (p_git, ["git"]),
    "asyncio": (p_asyncio, ["python3"]),
}


def summary(lines):
    """What the library did, over every process's line of a row."""
    t = {"copy": 0, "zc": 0, "copied": 0, "faults": 0, "detours": 0, "procs": len(lines)}
    fb = {}
    for l in lines:
        x = l.get("total") or {}
        t["copy"] += x.get("bytes_copy", 0)
        t["zc"] += x.get("bytes_zerocopy", 0)
        t["copied"] += x.get("copied_anyway", 0)
        t["faults"] += x.get("protection_faults", 0)
        t["detours"] += x.get("kernel_write_detours", 0)
        for k, v in (x.get("fallback_bytes") or {}).items():
            fb[k] = fb.get(k, 0) + v
    t["fallbacks"] = fb
    return t


def mib(n):
    return f"{n / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zcnet", default=None, help="the zcnet binary (default: target/release/zcnet, else target/debug/zcnet)")
    ap.add_argument("--size", type=int, default=32, help="MiB moved per row")
    ap.add_argument("--net", nargs="+", default=["loopback", "netns"])
    ap.add_argument("--modes", nargs="+", default=["none", "copy", "auto", "zerocopy", "cow"])
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--install", action="store_true", help="apt-get install the programs first")
    ap.add_argument("--local-zerocopy", action="store_true", help="ZCNET_LOCAL_ZEROCOPY=1: auto may choose zero-copy for a peer on this host")
    ap.add_argument("--json", help="write every row as a JSON line to this file")
    args = ap.parse_args()
    root = os.path.dirname(os.path.abspath(__file__)) + "/../../.."
    if args.zcnet is None:
        for c in ("target/release/zcnet", "target/debug/zcnet"):
            if os.path.exists(os.path.join(root, c)):
                args.zcnet = os.path.realpath(os.path.join(root, c))
                break
    if not args.zcnet:
        sys.exit("no zcnet binary: build one (cargo build --release -p zcnet-cli -p zcnet-preload) or give --zcnet")
    args.zcnet = os.path.realpath(args.zcnet)
    names = args.only or list(PROGRAMS)
    if args.install:
        pkgs = sorted({APT[c] for n in names for c in PROGRAMS[n][1] if c in APT and not have(c)})
        if pkgs:
            subprocess.run(["apt-get", "install", "-y", "-qq", *pkgs], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    work = tempfile.mkdtemp(prefix="zcnet-programs.", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    data = os.path.join(work, "data.bin")
    with open(data, "wb") as f:
        f.write(os.urandom(args.size << 20))
    digest = sha(data)
    rows, out = [], open(args.json, "w") if args.json else None
    print(f"{'program':12} {'net':8} {'mode':9} {'ok':4} {'wall s':>7} {'procs':>5} {'copy MiB':>9} {'zc MiB':>8} "
          f"{'copied MiB':>10} {'faults':>7} {'detours':>7}  fallbacks (MiB)", flush=True)
    try:
        for kind in args.net:
            net = Net(kind)
            try:
                for name in names:
                    fn, needs = PROGRAMS[name]
                    missing = [c for c in needs if not have(c)]
                    if missing:
                        print(f"{name:12} {kind:8} {'-':9} skip: needs {', '.join(missing)}", flush=True)
                        continue
                    for mode in args.modes:
                        row = Row(args, net, mode, work, data, digest)
                        t0 = time.time()
                        try:
                            ok, why = fn(row), ""
                        except Exception as e:  # a row that fails says why and the sitting goes on
                            ok, why = False, str(e).replace("\n", " ")[:300]
                        finally:
                            row.stop()
                        wall = time.time() - t0
                        s = summary(row.lines())
                        fb = " ".join(f"{k}={mib(v)}" for k, v in sorted(s["fallbacks"].items()))
                        print(f"{name:12} {kind:8} {mode:9} {'yes' if ok else 'NO':4} {wall:7.2f} {s['procs']:5} "
                              f"{mib(s['copy']):>9} {mib(s['zc']):>8} {mib(s['copied']):>10} {s['faults']:7} "
                              f"{s['detours']:7}  {fb}{('  ' + why) if why else ''}", flush=True)
                        rec = {"program": name, "net": kind, "mode": mode, "verified": ok, "wall_s": wall, "why": why, **s}
                        rows.append(rec)
                        if out:
                            out.write(json.dumps(rec) + "\n")
                        if ok:
                            shutil.rmtree(row.dir, ignore_errors=True)
            finally:
                net.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r for r in rows if not r["verified"]]
    print(f"({len(rows)} rows, {len(rows) - len(bad)} verified, {len(bad)} not; {args.size} MiB per row; zcnet: {args.zcnet})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
