"""CPU-bound code in the main interpreter and in two subinterpreters, each on its own thread.

Usage: subinterpreters.py SECONDS
Prints "ready main=<tid> sub_one=<interpreter id> sub_two=<interpreter id>" once the two
subinterpreters run, then spins in main_spin (main thread) until SECONDS have passed.
Subinterpreters come from concurrent.interpreters (3.14+), _interpreters (3.13) or
_xxsubinterpreters (3.12); each runs sub_<name>_work called by sub_<name>_outer.
"""
import sys
import threading
import time

SOURCE = """
import time

def sub_{name}_work(deadline):
    x = 0
    while time.monotonic() < deadline:
        for i in range(1000):
            x += i
    return x

def sub_{name}_outer(deadline):
    return sub_{name}_work(deadline)

sub_{name}_outer({deadline})
"""


def interpreter_api():
    try:
        from concurrent import interpreters

        def create():
            interp = interpreters.create()
            return interp.id, interp.exec
        return create
    except ImportError:
        pass
    try:
        import _interpreters as low
    except ImportError:
        import _xxsubinterpreters as low
    run = getattr(low, "exec", None) or low.run_string

    def create():
        iid = low.create()
        return int(iid), lambda code: run(iid, code)
    return create


def main_spin(deadline):
    x = 0
    while time.monotonic() < deadline:
        for i in range(1000):
            x += i
    return x


def main():
    seconds = float(sys.argv[1])
    deadline = time.monotonic() + seconds
    create = interpreter_api()
    ids = {}
    for name in ("one", "two"):
        iid, run = create()
        ids[name] = iid
        code = SOURCE.format(name=name, deadline=repr(deadline))
        threading.Thread(target=run, args=(code,), daemon=True).start()
    time.sleep(0.5)
    print("ready main=%d sub_one=%d sub_two=%d" % (threading.get_native_id(), ids["one"], ids["two"]), flush=True)
    main_spin(deadline)


main()
