/* Sends ROUNDS buffers of 1 MiB to ADDR:PORT with write(2) — byte i of the stream being
 * (i * 7) mod 251 — and after each send has an io_uring read (IORING_OP_READ, from a file)
 * fill the very buffer it just sent, while that send may still be in flight. The read runs
 * in the kernel, which no interposer sees: each must complete whole (never -EFAULT in its
 * completion) and leave the file's bytes; the stream must arrive as sent.
 *
 * WHEN: `before` makes the ring before the first send; `after` sends half the rounds
 * first (their buffers rewritten by stores) and makes the ring then, so that its first
 * read lands in a buffer sent just before.
 * HOW: `liburing` makes it with io_uring_queue_init; `syscall` with
 * syscall(SYS_io_uring_setup) and liburing's io_uring_queue_mmap, as the Rust io-uring
 * crate does. Linked with the shared liburing or the static one (the test builds both).
 *
 * usage: uring_reads ADDR PORT ROUNDS WHEN HOW
 */
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LEN (1 << 20)

static void fail(const char *what, int err) {
    fprintf(stderr, "%s: %s\n", what, strerror(err));
    exit(1);
}

static unsigned char other(size_t i) { return (unsigned char)((i * 13 + 5) % 241); }

static void make_ring(struct io_uring *ring, const char *how) {
    if (strcmp(how, "liburing") == 0) {
        int r = io_uring_queue_init(8, ring, 0);
        if (r < 0)
            fail("io_uring_queue_init", -r);
    } else {
        struct io_uring_params p;
        memset(&p, 0, sizeof p);
        long fd = syscall(SYS_io_uring_setup, 8, &p);
        if (fd < 0)
            fail("io_uring_setup", errno);
        int r = io_uring_queue_mmap((int)fd, &p, ring);
        if (r < 0)
            fail("io_uring_queue_mmap", -r);
    }
}

/* Reads LEN bytes of `file` into `buf` through the ring, in as many reads as it takes. */
static void ring_read(struct io_uring *ring, int file, unsigned char *buf) {
    for (size_t off = 0; off < LEN;) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (!sqe)
            fail("io_uring_get_sqe", EBUSY);
        io_uring_prep_read(sqe, file, buf + off, LEN - off, off);
        int r = io_uring_submit(ring);
        if (r != 1)
            fail("io_uring_submit", r < 0 ? -r : EIO);
        struct io_uring_cqe *cqe;
        r = io_uring_wait_cqe(ring, &cqe);
        if (r < 0)
            fail("io_uring_wait_cqe", -r);
        int res = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        if (res < 0)
            fail("io_uring read (its completion)", -res);
        if (res == 0)
            fail("io_uring read: end of file", EIO);
        off += (size_t)res;
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s ADDR PORT ROUNDS before|after liburing|syscall\n", argv[0]);
        return 2;
    }
    int rounds = atoi(argv[3]);
    int after = strcmp(argv[4], "after") == 0;
    const char *how = argv[5];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        fail("connect", errno);
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, LEN) != 0)
        fail("posix_memalign", ENOMEM);
    /* A file of LEN bytes of the other pattern, read through the ring. */
    FILE *f = tmpfile();
    if (!f)
        fail("tmpfile", errno);
    for (size_t i = 0; i < LEN; i++)
        fputc(other(i), f);
    fflush(f);
    int file = fileno(f);
    struct io_uring ring;
    int have_ring = 0;
    if (!after) {
        make_ring(&ring, how);
        have_ring = 1;
    }
    size_t pos = 0;
    int reads = 0;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < LEN; i++)
            buf[i] = (unsigned char)(((pos + i) * 7) % 251);
        for (size_t off = 0; off < LEN;) {
            ssize_t k = write(fd, buf + off, LEN - off);
            if (k <= 0)
                fail("write", errno);
            off += k;
        }
        pos += LEN;
        if (!have_ring && r + 1 >= rounds / 2) {
            make_ring(&ring, how);
            have_ring = 1;
        }
        if (have_ring) {
            ring_read(&ring, file, buf);
            for (size_t i = 0; i < LEN; i++)
                if (buf[i] != other(i)) {
                    fprintf(stderr, "round %d: byte %zu read %u, not %u\n", r, i, buf[i], other(i));
                    return 1;
                }
            reads++;
        }
    }
    if (close(fd) != 0)
        fail("close", errno);
    printf("%d reads\n", reads);
    return 0;
}
