"""The thread-status, exception and stack scenarios of CPython's own remote-inspection tests
(Lib/test/test_external_inspection.py), written anew for pyperch.

Usage: cpython_inspection.py SCENARIO OUT_JSON SECONDS GO_FILE

Every scenario starts its threads, writes OUT_JSON (each thread's native id under its name,
"tids", and what the scenario measured itself), then prints "ready <pid>". Exits on SIGTERM.

- exceptions: threads that spin on a CPU from GO_FILE's appearance for SECONDS, each in one of
  CPython's exception scenarios (TestExceptionDetectionScenarios, the exception-status tests of
  TestDetectionOfThreadStatus and the generator cases). Each asserts what `sys.exc_info()`
  says while it spins (HANDLING below) and, once done, adds its CPU time (time.thread_time) to
  OUT_JSON under "cpu" and writes "done": true.
  CPython's threads sleep in `time.sleep(0.01)` loops; these spin instead, because pyperch's
  `--mode exception` keeps on-CPU samples (CPython's status is a property of the thread,
  whatever it does).
- exceptions_hold: the same threads, each parked (time.sleep) in its scenario instead of
  spinning, from the start ("ready" once all are parked): for `pyperch dump`, whose
  "handling an exception" must equal HANDLING.
- too_long: one thread drives NESTED_TOO_LONG nested generators from an `except` block and
  spins in the innermost one, from GO_FILE for SECONDS: a chain longer than pyperch's kernel
  follows. Writes "cpu" and "done" as above.
- stacks: test_remote_stack_trace's bar -> baz -> foo thread asleep in time.sleep; a thread
  asleep inside an `except` block; one blocked on a held lock; one asleep DEEP frames down a
  recursion; and three workers asleep while the main thread spins alone
  (test_only_active_thread, test_thread_status_detection, test_thread_status_gil_detection:
  the busy thread is on a CPU and holds the GIL, the sleepers neither), after importing ctypes
  (test_self_trace_after_ctypes_import). OUT_JSON holds the
  blocked threads' stacks as the interpreter sees them (sys._current_frames), root first, as
  [function, file, line].

CPython 3.8 ... 3.15, stdlib only.
"""
import json
import os
import signal
import sys
import threading
import time

SCENARIO, OUT, SECONDS, GO = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
RESULT = {"tids": {}, "cpu": {}}
LOCK = threading.Lock()
NESTED = 9
NESTED_TOO_LONG = 600
DEEP = 300
HOLD = SCENARIO == "exceptions_hold"
PARKED = threading.Semaphore(0)


def write_result():
    with open(OUT + ".tmp", "w") as f:
        json.dump(RESULT, f)
    os.rename(OUT + ".tmp", OUT)


def wait_for_go():
    while not os.path.exists(GO):
        time.sleep(0.01)
    return time.monotonic() + SECONDS


def busy(handling):
    """The scenario's work: spins from the go file for SECONDS (or parks, exceptions_hold),
    asserting that `sys.exc_info()` says `handling` all along."""
    assert (sys.exc_info()[0] is not None) == handling, (handling, sys.exc_info())
    if HOLD:
        PARKED.release()
        while True:
            time.sleep(1000)
    stop = wait_for_go()
    x = 0
    while time.monotonic() < stop:
        for i in range(2000):
            x = (x + i) % 65521
        assert (sys.exc_info()[0] is not None) == handling
    return x


# --- exceptions: one function per scenario; HANDLING says what CPython reports for each.

def except_block():
    """test_except_block_has_exception: inside an except block."""
    try:
        raise ValueError("test")
    except ValueError:
        busy(True)


def finally_propagating():
    """test_finally_propagating_has_exception: an exception propagates through finally."""
    try:
        try:
            raise ValueError("propagating")
        finally:
            busy(True)
    except ValueError:
        pass


def finally_after_except():
    """test_finally_after_except_no_exception: finally after an except block handled it."""
    try:
        raise ValueError("test")
    except ValueError:
        pass
    finally:
        busy(False)


def finally_no_exception():
    """test_finally_no_exception_no_flag: finally, nothing raised."""
    try:
        pass
    finally:
        busy(False)


def normal_thread():
    """test_thread_status_exception_detection's normal thread: never raises."""
    busy(False)


def generator_body(handling):
    yield busy(handling)


def outer_handler_while_generator_runs():
    """test_outer_handler_while_generator_runs: the handler is outside, the thread runs in a
    generator (whose own exception state holds nothing) driven from the except block."""
    try:
        raise KeyError("outer")
    except KeyError:
        for _ in generator_body(True):
            pass


def nested(depth, handling):
    if depth == 0:
        yield busy(handling)
    else:
        yield from nested(depth - 1, handling)


def outer_handler_while_nested_generators_run():
    """test_outer_handler_while_nested_generators_run: NESTED generators deep."""
    try:
        raise KeyError("outer")
    except KeyError:
        for _ in nested(NESTED - 1, True):
            pass


def generator_own_handler():
    """A generator handles its own exception while its caller handles nothing."""
    def own():
        try:
            raise LookupError("inner")
        except LookupError:
            yield busy(True)
    for _ in own():
        pass


def suspended_handler():
    """A generator suspended inside its except block: its exception is not the thread's."""
    def suspended():
        try:
            raise LookupError("inner")
        except LookupError:
            yield 1
    g = suspended()
    next(g)
    busy(False)
    g.close()


EXCEPTION_SCENARIOS = {
    except_block: True,
    finally_propagating: True,
    finally_after_except: False,
    finally_no_exception: False,
    normal_thread: False,
    outer_handler_while_generator_runs: True,
    outer_handler_while_nested_generators_run: True,
    generator_own_handler: True,
    suspended_handler: False,
}


def run_named(func, ready):
    RESULT["tids"][func.__name__] = threading.get_native_id()
    ready.release()
    func()
    RESULT["cpu"][func.__name__] = time.thread_time()


def too_long():
    sys.setrecursionlimit(NESTED_TOO_LONG * 4 + 1000)
    try:
        raise KeyError("outer")
    except KeyError:
        for _ in nested(NESTED_TOO_LONG - 1, True):
            pass


# --- stacks

def foo():
    RESULT["tids"]["foo"] = threading.get_native_id()
    STACKS_READY.release()
    time.sleep(10_000)


def baz():
    foo()


def bar():
    for x in range(100):
        if x == 50:
            baz()


def asleep_in_except():
    try:
        raise ValueError("asleep in the handler")
    except ValueError:
        RESULT["tids"]["asleep_in_except"] = threading.get_native_id()
        STACKS_READY.release()
        time.sleep(10_000)


def blocked_on_lock():
    RESULT["tids"]["blocked_on_lock"] = threading.get_native_id()
    STACKS_READY.release()
    LOCK.acquire()


def recurse(n):
    if n == 0:
        RESULT["tids"]["recurse"] = threading.get_native_id()
        STACKS_READY.release()
        time.sleep(10_000)
        return 0
    return recurse(n - 1) + 1


def worker_thread(i):
    RESULT["tids"]["worker_%d" % i] = threading.get_native_id()
    STACKS_READY.release()
    time.sleep(10_000)


def main_work(stop):
    x = 0
    while stop is None or time.monotonic() < stop:
        for i in range(2000):
            x = (x + i) % 65521
    return x


STACKS_READY = threading.Semaphore(0)


def frames_of(tids):
    """Root-first [function, file, line] of the threads named in `tids`."""
    by_native = {tid: name for name, tid in tids.items()}
    idents = {t.ident: by_native.get(t.native_id) for t in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        name = idents.get(ident)
        if name is None:
            continue
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append([getattr(code, "co_qualname", code.co_name), code.co_filename, frame.f_lineno])
            frame = frame.f_back
        stack.reverse()
        out[name] = stack
    return out


def main():
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if SCENARIO in ("exceptions", "exceptions_hold", "too_long"):
        threading.stack_size(256 << 20)
        funcs = list(EXCEPTION_SCENARIOS) if SCENARIO != "too_long" else [too_long]
        ready = threading.Semaphore(0)
        threads = [threading.Thread(target=run_named, args=(f, ready), daemon=True) for f in funcs]
        for t in threads:
            t.start()
        for _ in threads:
            ready.acquire()
            if HOLD:
                PARKED.acquire()
        RESULT["handling"] = {f.__name__: h for f, h in EXCEPTION_SCENARIOS.items()}
        write_result()
        print("ready", os.getpid(), flush=True)
        for t in threads:
            t.join()
        RESULT["done"] = True
        write_result()
        while True:
            time.sleep(3600)
    elif SCENARIO == "stacks":
        # test_self_trace_after_ctypes_import: _ctypes may map libpython a second time
        # (gh-144563); the interpreter must still be found in the right mapping.
        import ctypes  # noqa: F401
        LOCK.acquire()
        targets = [bar, asleep_in_except, blocked_on_lock, lambda: recurse(DEEP)]
        targets += [(lambda i=i: worker_thread(i)) for i in range(3)]
        for target in targets:
            threading.Thread(target=target, daemon=True).start()
        for _ in targets:
            STACKS_READY.acquire()
        # Let the blocked threads reach their blocking calls.
        time.sleep(0.5)
        RESULT["main"] = threading.get_native_id()
        RESULT["stacks"] = frames_of(RESULT["tids"])
        write_result()
        print("ready", os.getpid(), flush=True)
        main_work(None)
    else:
        sys.exit("unknown scenario " + SCENARIO)


main()
