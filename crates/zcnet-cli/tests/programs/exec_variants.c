/* Sends LEN bytes to 127.0.0.1:PORT from a page-aligned buffer — byte i being
 * (i * 7) mod 251 — rewrites the buffer at once (the send may still be in flight), then
 * replaces its image with `true` through the C library's entry point VARIANT: execve,
 * execv, execvp, execvpe, execl, execlp, execle, fexecve. For posix_spawn it starts `true`
 * as a child instead, waits for it and exits normally.
 *
 * usage: exec_variants VARIANT PORT LEN
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    const char *v = argv[1];
    size_t len = strtoul(argv[3], NULL, 10);
    unsigned char *b;
    if (posix_memalign((void **)&b, 4096, len) != 0)
        return 1;
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)((i * 7) % 251);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, b + off, len - off, 0);
        if (n <= 0) {
            perror("send");
            return 1;
        }
        off += (size_t)n;
    }
    memset(b, 0xee, len);
    /* The socket stays open across the exec (no FD_CLOEXEC), as a server's would. */
    char *args[] = {"true", NULL};
    if (!strcmp(v, "posix_spawn")) {
        pid_t pid;
        if (posix_spawnp(&pid, "true", NULL, NULL, args, environ) != 0)
            return 1;
        int st;
        waitpid(pid, &st, 0);
        close(fd);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    if (!strcmp(v, "execve"))
        execve("/bin/true", args, environ);
    else if (!strcmp(v, "execv"))
        execv("/bin/true", args);
    else if (!strcmp(v, "execvp"))
        execvp("true", args);
    else if (!strcmp(v, "execvpe"))
        execvpe("true", args, environ);
    else if (!strcmp(v, "execl"))
        execl("/bin/true", "true", (char *)NULL);
    else if (!strcmp(v, "execlp"))
        execlp("true", "true", (char *)NULL);
    else if (!strcmp(v, "execle"))
        execle("/bin/true", "true", (char *)NULL, environ);
    else if (!strcmp(v, "fexecve")) {
        int x = open("/bin/true", O_RDONLY | O_CLOEXEC);
        if (x >= 0)
            fexecve(x, args, environ);
    }
    perror(v);
    return 1;
}
