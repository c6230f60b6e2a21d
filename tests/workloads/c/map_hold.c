/* Maps each FILE given (read-only, private), touches its first page, prints
 * "ready <pid>" and sleeps until killed. Not a Python process: pyperch's discovery looks at
 * every file it maps. Usage: map_hold FILE... */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    volatile char sink = 0;
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
            perror(argv[i]);
            return 1;
        }
        char *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        sink ^= p[0];
        close(fd);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        pause();
}
