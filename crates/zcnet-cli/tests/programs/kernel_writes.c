/* Sends ROUNDS buffers of 1 MiB to ADDR:PORT with write(2) — byte i of the stream being
 * (i * 7) mod 251 — and after each send has the kernel write into the very buffer it just
 * sent, while that send may still be in flight: getrandom(2), fread(3) from a file, readv(2)
 * from a file, recvmsg(2) from a Unix socket, in turn. Each must succeed whole (never
 * EFAULT) and leave the bytes it read; the stream must arrive as sent.
 *
 * usage: kernel_writes ADDR PORT ROUNDS
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define LEN (1 << 20)
#define PIECE (64 << 10)

static void fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, strerror(errno));
    exit(1);
}

static unsigned char other(size_t i) { return (unsigned char)((i * 13 + 5) % 241); }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s ADDR PORT ROUNDS\n", argv[0]);
        return 2;
    }
    int rounds = atoi(argv[3]);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        fail("connect");
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, LEN) != 0)
        fail("posix_memalign");
    /* A file of LEN bytes of the other pattern, read by fread and readv. */
    FILE *f = tmpfile();
    if (!f)
        fail("tmpfile");
    for (size_t i = 0; i < LEN; i++)
        fputc(other(i), f);
    fflush(f);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        fail("socketpair");
    size_t pos = 0;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < LEN; i++)
            buf[i] = (unsigned char)(((pos + i) * 7) % 251);
        for (size_t off = 0; off < LEN;) {
            ssize_t k = write(fd, buf + off, LEN - off);
            if (k <= 0)
                fail("write");
            off += k;
        }
        pos += LEN;
        size_t check = 0; /* bytes of the other pattern to check at the buffer's start */
        switch (r % 4) {
        case 0:
            for (size_t off = 0; off < LEN;) {
                ssize_t k = getrandom(buf + off, LEN - off, 0);
                if (k <= 0)
                    fail("getrandom");
                off += k;
            }
            break;
        case 1:
            rewind(f);
            if (fread(buf, 1, LEN, f) != LEN)
                fail("fread");
            check = LEN;
            break;
        case 2: {
            struct iovec v[2] = {{buf, LEN / 2}, {buf + LEN / 2, LEN / 2}};
            ssize_t k = preadv(fileno(f), v, 2, 0);
            if (k != LEN)
                fail("preadv");
            if (lseek(fileno(f), 0, SEEK_SET) != 0 || readv(fileno(f), v, 2) != LEN)
                fail("readv");
            check = LEN;
            break;
        }
        case 3: {
            unsigned char tmp[PIECE];
            for (size_t i = 0; i < PIECE; i++)
                tmp[i] = other(i);
            if (write(sv[0], tmp, PIECE) != PIECE)
                fail("write to the Unix socket");
            struct iovec v = {buf, PIECE};
            struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
            for (size_t got = 0; got < PIECE;) {
                v.iov_base = buf + got;
                v.iov_len = PIECE - got;
                ssize_t k = recvmsg(sv[1], &m, 0);
                if (k <= 0)
                    fail("recvmsg");
                got += k;
            }
            check = PIECE;
            break;
        }
        }
        for (size_t i = 0; i < check; i++)
            if (buf[i] != other(i)) {
                fprintf(stderr, "round %d: byte %zu read wrong\n", r, i);
                return 1;
            }
    }
    return close(fd) == 0 ? 0 : 1;
}
