/* Sends LEN bytes to 127.0.0.1:PORT from a page-aligned buffer — byte i being
 * (i * 7) mod 251 — rewrites the buffer at once (the send may still be in flight), then
 * replaces its image with itself in `watch` mode through the C library's entry point
 * VARIANT: execve, execv, execvp, execvpe, execl, execlp, execle, fexecve (execvp, execvpe
 * and execlp find `exec_variants` on PATH). Those that take an environment pass this one
 * with EXEC_VARIANTS_VIA=VARIANT added. For posix_spawn it starts `true` as a child
 * instead, waits for it and exits normally.
 *
 * In `watch` mode the new image polls the socket FD it inherited for half a second, sends
 * the stream's next TAIL bytes (from byte OFF on), and prints "clean" or "POLLERR" — did
 * the socket show an error — and the EXEC_VARIANTS_VIA it was given, or "-".
 *
 * usage: exec_variants VARIANT PORT LEN
 *        exec_variants watch FD OFF TAIL
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Sends bytes [off, off + len) of the stream on fd from a fresh page-aligned buffer. */
static int send_pattern(int fd, size_t off, size_t len) {
    unsigned char *b;
    if (posix_memalign((void **)&b, 4096, len ? len : 1) != 0)
        return -1;
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)(((off + i) * 7) % 251);
    for (size_t done = 0; done < len;) {
        ssize_t n = send(fd, b + done, len - done, 0);
        if (n <= 0) {
            perror("send");
            return -1;
        }
        done += (size_t)n;
    }
    memset(b, 0xee, len);
    return 0;
}

static int watch(char **argv) {
    int fd = atoi(argv[2]);
    size_t off = strtoul(argv[3], NULL, 10);
    size_t tail = strtoul(argv[4], NULL, 10);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    /* Nothing ever comes in: poll returns early only for an error (or a hang-up). */
    int n = poll(&p, 1, 500);
    int err = n > 0 && (p.revents & POLLERR);
    if (send_pattern(fd, off, tail) != 0)
        return 1;
    close(fd);
    const char *via = getenv("EXEC_VARIANTS_VIA");
    printf("%s %s\n", err ? "POLLERR" : "clean", via ? via : "-");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "watch"))
        return watch(argv);
    if (argc != 4)
        return 2;
    const char *v = argv[1];
    size_t len = strtoul(argv[3], NULL, 10);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    if (send_pattern(fd, 0, len) != 0)
        return 1;
    if (!strcmp(v, "posix_spawn")) {
        char *args[] = {"true", NULL};
        pid_t pid;
        if (posix_spawnp(&pid, "true", NULL, NULL, args, environ) != 0)
            return 1;
        int st;
        waitpid(pid, &st, 0);
        close(fd);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    /* The socket stays open across the exec (no FD_CLOEXEC), as a server's would. The new
     * image sends the stream's last megabyte after this one's. */
    char fds[16], off[32];
    snprintf(fds, sizeof fds, "%d", fd);
    snprintf(off, sizeof off, "%zu", len);
    char *tail = "1048576";
    char *args[] = {"exec_variants", "watch", fds, off, tail, NULL};
    size_t k = 0;
    while (environ[k])
        k++;
    char **env = calloc(k + 2, sizeof *env);
    memcpy(env, environ, k * sizeof *env);
    char via[64];
    snprintf(via, sizeof via, "EXEC_VARIANTS_VIA=%s", v);
    env[k] = via;
    const char *self = "/proc/self/exe";
    /* execl's list: the path in a register, then arg0 to arg4 in the other five, the NULL
     * (and execle's environment) on the stack — both halves of the list are used. */
    if (!strcmp(v, "execve"))
        execve(self, args, env);
    else if (!strcmp(v, "execv"))
        execv(self, args);
    else if (!strcmp(v, "execvp"))
        execvp("exec_variants", args);
    else if (!strcmp(v, "execvpe"))
        execvpe("exec_variants", args, env);
    else if (!strcmp(v, "execl"))
        execl(self, "exec_variants", "watch", fds, off, tail, (char *)NULL);
    else if (!strcmp(v, "execlp"))
        execlp("exec_variants", "exec_variants", "watch", fds, off, tail, (char *)NULL);
    else if (!strcmp(v, "execle"))
        execle(self, "exec_variants", "watch", fds, off, tail, (char *)NULL, env);
    else if (!strcmp(v, "fexecve")) {
        int x = open(self, O_RDONLY | O_CLOEXEC);
        if (x >= 0)
            fexecve(x, args, env);
    }
    perror(v);
    return 1;
}
