// A C++ library for `--native` (tests/tests/native.rs, demangled names): a member function
// template in a namespace, instantiated for int, spins for the seconds asked. Built by the
// test with `g++ -O2 -g -shared -fPIC`; native_cpp.py calls it through ctypes.
#include <chrono>

namespace pyperch {

template <typename T>
struct Spinner {
    // noinline: the frame stays in the stack with its mangled name
    // (_ZN7pyperch7SpinnerIiE4spinEd).
    __attribute__((noinline)) static T spin(double seconds) {
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        volatile T x = 0;
        while (std::chrono::steady_clock::now() < until) {
            for (int i = 0; i < 1000; i++) {
                x = x + 1;
            }
        }
        return x;
    }
};

}  // namespace pyperch

extern "C" int pyperch_cpp_spin(double seconds) {
    return pyperch::Spinner<int>::spin(seconds);
}
