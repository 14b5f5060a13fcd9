/* Connects to 127.0.0.1:PORT (or the IPv4 address given), installs a strict seccomp filter
 * itself — by prctl(PR_SET_SECCOMP) or by syscall(SYS_seccomp), as libseccomp does — and
 * then sends SIZE bytes (a counter pattern, byte i = i * 7 mod 251) with write(2) in 1 MiB
 * calls from a page-aligned buffer, then _exit(0). Any system call the filter does not
 * allow kills the process (SIGSYS), as OpenSSH's pre-authentication sandbox does.
 *
 * usage: seccomp_send ADDR PORT SIZE prctl|syscall
 */
#include <arpa/inet.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "add this architecture's AUDIT_ARCH"
#endif

#define ALLOW(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
                  BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s ADDR PORT SIZE prctl|syscall\n", argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[3], NULL, 10);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    size_t chunk = 1 << 20;
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, chunk) != 0)
        return 1;
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        ALLOW(__NR_write),
        ALLOW(__NR_exit_group),
        ALLOW(__NR_exit),
        ALLOW(__NR_rt_sigreturn),
        ALLOW(__NR_futex),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        perror("no_new_privs");
        return 1;
    }
    int r = strcmp(argv[4], "syscall") == 0
                ? (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)
                : prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    if (r != 0) {
        perror("seccomp");
        return 1;
    }
    size_t sent = 0;
    while (sent < size) {
        size_t n = size - sent < chunk ? size - sent : chunk;
        for (size_t i = 0; i < n; i++)
            buf[i] = (unsigned char)(((sent + i) * 7) % 251);
        size_t off = 0;
        while (off < n) {
            ssize_t k = write(fd, buf + off, n - off);
            if (k <= 0)
                _exit(3);
            off += k;
        }
        sent += n;
    }
    _exit(0);
}
