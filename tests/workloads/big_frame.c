/* A C function whose own stack frame is larger than the 16 KiB a stack copy can hold
 * (tests/tests/native_walk.rs): pyperch_big_frame keeps a 24 KiB array on its stack, fills
 * it, and calls a Python function back through a ctypes callback from inside that frame.
 * Frames below it (the Python caller, the interpreter, main) lie more than 24 KiB above the
 * callback's stack pointer. Built with -fomit-frame-pointer: only the unwind tables lead past
 * it. */
#include <stdint.h>
#include <string.h>

#define BIG_BYTES (24 * 1024)

__attribute__((noinline)) uint64_t pyperch_big_frame(uint64_t (*fn)(uint64_t), uint64_t times) {
    volatile unsigned char big[BIG_BYTES];
    memset((void *)big, 7, sizeof big);
    uint64_t total = 0;
    for (uint64_t i = 0; i < times; i++) {
        total += fn(i) + big[i % BIG_BYTES];
    }
    return total;
}
