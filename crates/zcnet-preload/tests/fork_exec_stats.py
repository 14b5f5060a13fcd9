"""Run by fork_exec_stats.rs under the library. A parent sends on its own connection, then
makes children every way a program does — `subprocess` (vfork + execve), fork + execv, a
fork that only exits — some of which send on connections of their own and some nothing,
then sends again. Every connection is read whole by a thread here and checked against the
pattern; the script prints the bytes each process sent, which the stats lines must add up
to exactly.

Usage: fork_exec_stats.py            (the parent)
       fork_exec_stats.py send PORT N (a child's new image: connects and sends N bytes)
"""

import os, socket, subprocess, sys, threading

PERIOD = bytes((i * 7) % 251 for i in range(251))


def pattern(n):
    return (PERIOD * (n // 251 + 1))[:n]


def send(port, n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(pattern(n))
    s.close()


if len(sys.argv) > 1:
    assert sys.argv[1] == "send"
    send(int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(0)

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
port = listener.getsockname()[1]
received = []
bad = []


def reader(c):
    got = bytearray()
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        got += b
    if bytes(got) != pattern(len(got)):
        bad.append(len(got))
    received.append(len(got))


def acceptor():
    while True:
        c, _ = listener.accept()
        threading.Thread(target=reader, args=(c,)).start()


threading.Thread(target=acceptor, daemon=True).start()

N1, N2 = (3 << 20) + 123, (2 << 20) + 77
M1, M2 = (5 << 20) + 11, (1 << 20) + 5
me = socket.create_connection(("127.0.0.1", port))
data = pattern(N1 + N2)
me.sendall(data[:N1])

cmd = [sys.executable, __file__, "send", str(port)]
# subprocess: vfork + execve on this interpreter; one child sends, one does not.
subprocess.run(cmd + [str(M1)], check=True)
subprocess.run(["true"], check=True)

# fork + execv: one child sends, one does not.
for args in ([sys.executable] + cmd[1:] + [str(M2)], ["true"]):
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(args[0], args)
        finally:
            os._exit(127)
    _, st = os.waitpid(pid, 0)
    assert st == 0, st

# A forked child that sends nothing and ends through the interpreter's normal exit (the
# library's exit handler runs).
pid = os.fork()
if pid == 0:
    sys.exit(0)
_, st = os.waitpid(pid, 0)
assert st == 0, st

me.sendall(data[N1:])
me.close()
want = sorted([N1 + N2, M1, M2])
for _ in range(500):
    if len(received) == len(want):
        break
    threading.Event().wait(0.01)
assert sorted(received) == want and not bad, (sorted(received), want, bad)
print(f"ok sent {N1 + N2 + M1 + M2} by 3 processes", flush=True)
