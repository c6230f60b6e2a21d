/* The C side of native.py (built by tests/tests/native.rs, loaded through ctypes):
 * pyperch_spin burns CPU in C without calling anything; pyperch_callback calls a Python
 * function back through a ctypes callback. Both are kept out of line, with frame pointers,
 * so that their frames exist whatever the compiler does. */
#include <stdint.h>

__attribute__((noinline)) uint64_t pyperch_spin(uint64_t rounds) {
    volatile uint64_t x = 1;
    for (uint64_t i = 0; i < rounds; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    return x;
}

__attribute__((noinline)) uint64_t pyperch_callback(uint64_t (*fn)(uint64_t), uint64_t times) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < times; i++) {
        total += fn(i);
    }
    return total;
}
