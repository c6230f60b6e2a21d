/* Loads a libpython with dlopen() and never initialises it, in COUNT processes: the parent
 * loads it, then forks COUNT-1 children that inherit the mapping. All sleep until killed
 * (the children die with the parent: PR_SET_PDEATHSIG). Prints "ready <pid>" once every
 * child exists. Usage: dlopen_idle LIBPYTHON COUNT */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: dlopen_idle LIBPYTHON COUNT\n");
        return 2;
    }
    if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    int count = atoi(argv[2]);
    pid_t parent = getpid();
    for (int i = 1; i < count; i++) {
        pid_t child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(0);
            for (;;)
                pause();
        }
    }
    printf("ready %d\n", (int)parent);
    fflush(stdout);
    for (;;)
        pause();
}
