"""Sends 4 MiB from a page-aligned anonymous mapping over one loopback TCP connection and
checks every byte on the receiving side (SHA-256). Run under libzcnet_preload.so by
page_cost_cache.rs: the send is eligible for zero-copy, so `auto` needs this host's page
costs."""

import hashlib, mmap, socket, threading

SIZE = 4 << 20
buf = mmap.mmap(-1, SIZE)
for i in range(0, SIZE, 4096):
    buf[i:i + 4096] = bytes([(i >> 12) & 0xFF]) * 4096
want = hashlib.sha256(buf).hexdigest()

lst = socket.socket()
lst.bind(("127.0.0.1", 0))
lst.listen(1)
got = {}


def receive():
    c, _ = lst.accept()
    h, n = hashlib.sha256(), 0
    while b := c.recv(1 << 20):
        h.update(b)
        n += len(b)
    got["hash"], got["n"] = h.hexdigest(), n


t = threading.Thread(target=receive)
t.start()
s = socket.create_connection(lst.getsockname())
s.sendall(memoryview(buf))
s.close()
t.join()
assert got["n"] == SIZE and got["hash"] == want, got
print("ok 4 MiB verified")
