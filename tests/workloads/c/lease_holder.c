/* Maps files of its own and holds a write lease on each (the hostile process of issue #9).
 *
 * Usage: lease_holder FILE...   (run as the files' owner, e.g. nobody)
 * Each FILE is created (64 KiB of non-ELF bytes), opened read-write, mapped, and leased
 * with fcntl(F_SETLEASE, F_WRLCK). SIGIO (sent when someone breaks a lease) is ignored,
 * so a lease is never given up voluntarily. Prints "ready <pid>" once every lease is held,
 * then sleeps until killed. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    signal(SIGIO, SIG_IGN);
    static char block[65536];
    memset(block, 'x', sizeof block);
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, block, sizeof block) != (ssize_t)sizeof block) {
            perror(argv[i]);
            return 1;
        }
        if (mmap(NULL, sizeof block, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        if (fcntl(fd, F_SETLEASE, F_WRLCK) != 0) {
            perror("F_SETLEASE");
            return 1;
        }
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        pause();
}
