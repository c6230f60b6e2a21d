"""A busy process whose names are hostile text, for the escaping tests.

Usage: hostile.py COMM_HEX MAX_SECONDS

COMM_HEX: bytes (hex) given to prctl(PR_SET_NAME), or "-" to keep the command name. The
busy function is `hostile_leaf` renamed (co_name, and co_qualname from 3.11) to
FUNCTION_NAME, compiled under the file name FILE_NAME: both hold an escape sequence, control
characters, a bidi override, a `;` and a newline. Prints "ready <pid>" once spinning; exits
on SIGTERM or after MAX_SECONDS. Plain Python that also runs on 3.6 and 3.7.
"""
import ctypes
import signal
import sys
import time
import types

FUNCTION_NAME = "hostile_leaf\x1b]0;pwned\x07\x1b[2J\u202e\u2028\x9b;semi\nline"
FILE_NAME = "/tmp/evil\x1b[31m\r\nfile\u202e.py"
SOURCE = """
def hostile_leaf(deadline, stop):
    x = 0
    while not stop and time.monotonic() < deadline:
        for i in range(10000):
            x = (x + i) % 65521
    return x
"""

STOP = []


def main():
    if sys.argv[1] != "-":
        libc = ctypes.CDLL(None, use_errno=True)
        name = bytes.fromhex(sys.argv[1])
        if libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0) != 0:  # PR_SET_NAME
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME)")
    namespace = {"time": time}
    exec(compile(SOURCE, FILE_NAME, "exec"), namespace)
    code = namespace["hostile_leaf"].__code__
    if hasattr(code, "replace"):  # 3.8+; 3.6 and 3.7 (unsupported) keep the plain name
        code = code.replace(co_name=FUNCTION_NAME)
    if hasattr(code, "co_qualname"):
        code = code.replace(co_qualname=FUNCTION_NAME)
    leaf = types.FunctionType(code, namespace, FUNCTION_NAME)
    signal.signal(signal.SIGTERM, lambda *_: STOP.append(1))
    deadline = time.monotonic() + float(sys.argv[2])
    print("ready %d" % __import__("os").getpid(), flush=True)
    while not STOP and time.monotonic() < deadline:
        leaf(deadline, STOP)


main()
