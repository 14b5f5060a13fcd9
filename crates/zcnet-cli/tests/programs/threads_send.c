/* THREADS threads send on one TCP socket to ADDR:PORT, taking turns under a mutex of the
 * program's own, each MSGS messages from its own page-aligned buffer, which it rewrites
 * for its next message the moment its send returns (while the kernel may still read the
 * last one: under the library, a write fault on a protected page). A message is a 12-byte
 * header — thread, sequence, length, little-endian u32s — and LEN payload bytes, byte i
 * being (thread * 31 + seq * 7 + i) mod 251.
 *
 * usage: threads_send ADDR PORT THREADS MSGS LEN
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fd;
static unsigned msgs;
static size_t len;
static pthread_mutex_t turn = PTHREAD_MUTEX_INITIALIZER;

static void fill(unsigned char *b, uint32_t t, uint32_t seq) {
    uint32_t h[3] = {t, seq, (uint32_t)len};
    memcpy(b, h, sizeof h);
    for (size_t i = 0; i < len; i++)
        b[12 + i] = (unsigned char)((t * 31 + seq * 7 + i) % 251);
}

static void *run(void *arg) {
    uint32_t t = (uint32_t)(uintptr_t)arg;
    unsigned char *b;
    /* The payload starts on a page boundary: the header is the last 12 bytes of a page. */
    if (posix_memalign((void **)&b, 4096, len + 4096) != 0)
        exit(1);
    b += 4096 - 12;
    fill(b, t, 0);
    for (uint32_t seq = 0; seq < msgs; seq++) {
        pthread_mutex_lock(&turn);
        size_t off = 0;
        while (off < len + 12) {
            ssize_t k = write(fd, b + off, len + 12 - off);
            if (k <= 0) {
                perror("write");
                exit(3);
            }
            off += k;
        }
        pthread_mutex_unlock(&turn);
        fill(b, t, seq + 1); /* rewrite at once: the last send may still be in flight */
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s ADDR PORT THREADS MSGS LEN\n", argv[0]);
        return 2;
    }
    unsigned threads = atoi(argv[3]);
    msgs = atoi(argv[4]);
    len = strtoull(argv[5], NULL, 10);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    pthread_t th[64];
    for (unsigned i = 0; i < threads && i < 64; i++)
        pthread_create(&th[i], NULL, run, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < threads && i < 64; i++)
        pthread_join(th[i], NULL);
    return close(fd) == 0 ? 0 : 1;
}
