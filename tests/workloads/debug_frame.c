/* A chain of C functions whose call frame information is only in .debug_frame
 * (tests/tests/native_walk.rs builds it with gcc -g -fno-asynchronous-unwind-tables
 * -fno-unwind-tables -fomit-frame-pointer -O2: no FDE in .eh_frame, no frame pointers).
 * Python calls pyperch_df_outer through ctypes; it calls pyperch_df_middle, whose frame
 * holds a 4 KiB array, which calls pyperch_df_leaf, which spins. Only .debug_frame's rows
 * lead from the leaf back to the Python caller. noipa: no inlining, cloning or tail calls
 * change the chain. */
#include <stdint.h>
#include <string.h>

__attribute__((noipa)) uint64_t pyperch_df_leaf(uint64_t n) {
    volatile uint64_t x = 0;
    for (uint64_t i = 0; i < n; i++) {
        x += i * 3;
    }
    return x;
}

__attribute__((noipa)) uint64_t pyperch_df_middle(uint64_t n) {
    volatile unsigned char pad[4096];
    memset((void *)pad, 1, sizeof pad);
    return pyperch_df_leaf(n + pad[n % sizeof pad]) + 1;
}

__attribute__((noipa)) uint64_t pyperch_df_outer(uint64_t n) {
    return pyperch_df_middle(n) * 2 + 1;
}
