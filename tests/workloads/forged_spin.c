/* Test helper for forged_memory.py (compiled by tests/tests/forged_memory.rs with gcc).
 *
 * forge_spin(slot, forged, seconds, flip, flip_len): saves *slot, stores `forged` there,
 * burns CPU for `seconds` (optionally rewriting the `flip_len` bytes at `flip` all the
 * while), then puts the saved pointer back and returns. Called through ctypes, which
 * releases the GIL: while it runs the interpreter does not touch its current-frame pointer,
 * so a sampler sees exactly the forged state, and the interpreter never does. */
#include <stdint.h>
#include <stddef.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t forge_spin(volatile uint64_t *slot, uint64_t forged, double seconds,
                    volatile uint8_t *flip, size_t flip_len) {
    uint64_t saved = *slot;
    uint64_t x = 0;
    *slot = forged;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    double end = now() + seconds;
    while (now() < end) {
        for (int i = 0; i < 1000; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        }
        for (size_t i = 0; i < flip_len; i++) {
            flip[i] = (uint8_t)(x >> (8 * (i & 7)));
        }
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    *slot = saved;
    return x;
}
