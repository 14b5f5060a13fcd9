"""Run by freed_in_flight.rs under the library: the six lines of issue 42 — a fresh 8 MiB
of os.urandom, sent, then freed — in a loop. malloc hands the freed memory, whose pages a
zero-copy send may still be reading (write-protected), to the next os.urandom: the
kernel's getrandom write into it must not fail (EFAULT), and every byte must arrive as
sent (a SHA-256 of each end)."""

import hashlib, os, socket, sys, threading

ROUNDS = int(sys.argv[1])
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
got = {}


def reader():
    c, _ = listener.accept()
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        h.update(b)
        n += len(b)
    got["h"], got["n"] = h.digest(), n


t = threading.Thread(target=reader, daemon=True)
t.start()
s = socket.create_connection(listener.getsockname())
sent = hashlib.sha256()
for _ in range(ROUNDS):
    data = os.urandom(8 << 20)
    sent.update(data)
    s.sendall(data)
    del data
s.close()
t.join(120)
assert got["n"] == ROUNDS * (8 << 20) and got["h"] == sent.digest(), got["n"]
print("ok", got["n"], flush=True)
