"""Two connections in turn from this process to one peer, each sending one 8 MiB buffer
eight times. The buffer lies in transparent huge pages (2 MiB aligned, MADV_HUGEPAGE) and is
never written between sends, so `auto` sends it protected wherever protecting huge pages
costs less than copying them (on 4 KiB pages it depends on the host's copy speed). Run
under the library with ZCNET_LOCAL_ZEROCOPY=1, so that loopback counts as a peer whose
delivery copies (as veth into another namespace does): the first connection's COPIED
completions demote it; the second must copy from its first send. The receiver checks
every byte of both."""

import ctypes, hashlib, mmap, socket, threading

MIB = 1 << 20
HUGE, SIZE, SENDS = 2 * MIB, 8 * MIB, 8


def main():
    m = mmap.mmap(-1, SIZE + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    off = (-base) % HUGE
    m.madvise(mmap.MADV_HUGEPAGE, off, SIZE)
    view = memoryview(m)[off:off + SIZE]
    for i in range(0, SIZE, 32):
        view[i:i + 32] = hashlib.sha256(i.to_bytes(8, "little")).digest()
    want = hashlib.sha256(bytes(view) * SENDS).hexdigest()
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(2)
    got = []

    def receive():
        for _ in range(2):
            c, _ = ls.accept()
            h, n = hashlib.sha256(), 0
            while b := c.recv(MIB):
                h.update(b)
                n += len(b)
            got.append((n, h.hexdigest()))
            c.close()

    t = threading.Thread(target=receive)
    t.start()
    for _ in range(2):
        s = socket.create_connection(ls.getsockname())
        for _ in range(SENDS):
            s.sendall(view)
        s.close()
    t.join()
    for n, h in got:
        assert (n, h) == (SIZE * SENDS, want), (n, h)
    view.release()
    print("ok both connections verified")


main()
