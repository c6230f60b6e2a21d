"""A hostile target: forges its own interpreter state through ctypes while being sampled.

Usage: forged_memory.py LIBFORGED SCENARIO MAX_SECONDS

LIBFORGED is tests/workloads/forged_spin.c compiled as a shared library. SCENARIO names
one forged state (see SCENARIOS). The process builds the forged frames, code objects,
strings and line tables in ctypes buffers, then repeatedly calls forge_spin(), which (with
the GIL released) points this thread's current-frame pointer at the forged state, burns
CPU, and puts the real pointer back before returning. The interpreter itself never sees
the forged state; a sampler sees almost nothing else.

qualname_stalled_page takes a fourth argument, a file (of a FUSE file system whose server
is about to stop answering): it is mapped (MAP_SHARED, 64 KiB, never touched) and the forged
code object's qualname points into its ninth page, so that whoever reads it faults a page
in from a server that never answers. Forging starts 3 s after the mapping, once the test
stopped the server.

Prints "ready <pid> scenario=NAME" once forging; stops on SIGTERM or after MAX_SECONDS.
Lowers its own priority (nice 19) so that a benign process profiled beside it gets enough
CPU for a meaningful count on a loaded machine. Runs on CPython 3.8 ... 3.15 (x86_64, default GIL builds).
"""
import ctypes
import os
import signal
import sys
import time

V = sys.version_info[:2]
MASK = (1 << 64) - 1
KERNEL = 0xFFFF888000000000  # the start of Linux's direct map on x86_64

# Where this thread's current-frame pointer is: (offset in PyThreadState, offset in the
# _PyCFrame it points to, or None when the pointer is in the thread state itself).
if V <= (3, 10):
    SLOT = (0x18, None)
elif V == (3, 11):
    SLOT = (0x38, 0x08)
elif V == (3, 12):
    SLOT = (0x38, 0x00)
else:
    SLOT = (0x48, None)

# Frame fields: previous, code, instruction (kind), owner.
if V <= (3, 10):
    F_PREVIOUS, F_CODE = 0x18, 0x20
    F_INSTR, INSTR_KIND = (0x68, "bytes") if V <= (3, 9) else (0x60, "units")
elif V == (3, 11):
    F_PREVIOUS, F_CODE, F_INSTR, INSTR_KIND = 0x30, 0x20, 0x38, "pointer"
else:
    F_PREVIOUS, F_CODE, F_INSTR, INSTR_KIND = 0x08, 0x00, 0x38, "pointer"

# Code object fields.
if V <= (3, 10):
    C_FILENAME, C_NAME, C_QUALNAME, C_LINETABLE, C_FIRSTLINENO = 0x68, 0x70, None, 0x78, 0x28
    C_ADAPTIVE = C_FIRSTTRACEABLE = None
else:
    C_FILENAME, C_NAME, C_QUALNAME, C_LINETABLE = 0x70, 0x78, 0x80, 0x88
    C_FIRSTLINENO = 0x48 if V == (3, 11) else 0x44
    C_ADAPTIVE, C_FIRSTTRACEABLE = {
        (3, 11): (0xB8, 0xA8),
        (3, 12): (0xC0, 0xB0),
        (3, 13): (0xC8, 0xB8),
    }.get(V, (0xD0, 0xC0))

# str and bytes objects.
S_LENGTH, S_HASH, S_STATE = 0x10, 0x18, 0x20
S_ASCII_DATA = 0x30 if V <= (3, 11) else 0x28
S_COMPACT_DATA = 0x48 if V <= (3, 11) else 0x38
B_SIZE, B_DATA = 0x10, 0x20

KIND_SHIFT, COMPACT, ASCII = 2, 1 << 5, 1 << 6

STOP = []
KEEP = []  # every forged buffer stays alive for the life of the process


def forged_target():
    """The function the forged frames claim to run (its code object is copied and bent)."""
    x = 0
    for i in range(10):
        x += i
    return x


def buf(n):
    b = ctypes.create_string_buffer(n)
    KEEP.append(b)
    return ctypes.addressof(b)


def r64(a):
    return ctypes.c_uint64.from_address(a).value


def w64(a, v):
    ctypes.c_uint64.from_address(a).value = v & MASK


def r32(a):
    return ctypes.c_uint32.from_address(a).value


def w32(a, v):
    ctypes.c_uint32.from_address(a).value = v & 0xFFFFFFFF


def copy_of(obj, room=0):
    """A byte-for-byte copy of `obj` in a buffer of its size plus `room`."""
    n = obj.__sizeof__()
    a = buf(n + room + 64)
    ctypes.memmove(a, id(obj), n)
    return a


TARGET = forged_target.__code__
FIRSTTRACEABLE = r32(id(TARGET) + C_FIRSTTRACEABLE) if C_FIRSTTRACEABLE else 0


def fake_code(**fields):
    """A copy of forged_target's code object with some pointer/int fields replaced."""
    a = copy_of(TARGET)
    for name, value in fields.items():
        offset = {
            "filename": C_FILENAME,
            "name": C_NAME,
            "qualname": C_QUALNAME if C_QUALNAME is not None else C_NAME,
            "linetable": C_LINETABLE,
        }.get(name)
        if offset is not None:
            w64(a + offset, value)
        elif name == "firstlineno":
            w32(a + C_FIRSTLINENO, value)
        else:
            raise ValueError(name)
    return a


def fake_str(text="forged_name", length=None, state=None, data_pointer=None):
    """A copy of a real compact ASCII str, with its header bent."""
    s = "".join([text])  # a fresh, non-interned object
    a = copy_of(s, room=16)
    if length is not None:
        w64(a + S_LENGTH, length)
    if state is not None:
        w32(a + S_STATE, state)
    if data_pointer is not None:
        w64(a + S_COMPACT_DATA, data_pointer)
    return a


def fake_bytes(content=b"", size=None):
    """A bytes object built by hand: header copied from a real one, then `content`."""
    model = b"x"
    a = buf(B_DATA + len(content) + 16)
    ctypes.memmove(a, id(model), B_DATA)
    w64(a + B_SIZE, len(content) if size is None else size)
    ctypes.memmove(a + B_DATA, content, len(content))
    return a


def frame(code, previous=0, units=None):
    """A forged interpreter frame running `code` at code unit `units`."""
    f = buf(0x100)
    if units is None:
        units = FIRSTTRACEABLE + 1
    w64(f + F_CODE, code)
    w64(f + F_PREVIOUS, previous)
    if INSTR_KIND == "bytes":
        w32(f + F_INSTR, 2 * units)
    elif INSTR_KIND == "units":
        w32(f + F_INSTR, units)
    else:
        w64(f + F_INSTR, code + C_ADAPTIVE + 2 * units)
    return f


def max_varint_table(size):
    """A line table of `size` bytes made of the largest encodings the format allows."""
    if V <= (3, 10):
        # (255-byte step, -1 line) pairs in lnotab / the 3.10 pair table.
        return b"\xff" * size
    # 3.11+ location entries LONG (code 14), 1 unit, line delta = the largest 32-bit
    # varint, then 3 column varints of 6 bytes each.
    varint = b"\x7e\x7f\x7f\x7f\x7f\x03"
    entry = b"\xf0" + varint * 4
    return (entry * (size // len(entry) + 1))[:size]


class Scenario:
    """What forge_spin installs: `top` (the forged current frame), the forged frames whose
    `previous` must be the real frame of the caller (patched before every call), and bytes
    the C loop keeps rewriting."""

    def __init__(self, top, to_real=(), flip=0, flip_len=0):
        self.top = top
        self.to_real = list(to_real)
        self.flip = flip
        self.flip_len = flip_len


def one_frame(code, **kw):
    f = frame(code, **kw)
    return Scenario(f, [f])


def qualname_is(s):
    return one_frame(fake_code(qualname=s))


def not_a_str():
    # A bytes object whose bytes, read with str offsets, make a valid compact ASCII str
    # header: the state word where a str has it, then ASCII text.
    state = 1 << KIND_SHIFT | COMPACT | ASCII
    pad = S_STATE - B_DATA
    text = b"this_is_bytes_not_a_str"
    content = b"\0" * pad + state.to_bytes(4, "little") + b"\0" * (S_ASCII_DATA - S_STATE - 4) + text
    a = fake_bytes(content)
    w64(a + S_LENGTH, len(text))  # B_SIZE == S_LENGTH: the "length"
    return a


def build(name):
    target = id(TARGET)
    if name == "self_cycle":
        f = frame(target)
        w64(f + F_PREVIOUS, f)
        return Scenario(f)
    if name == "two_cycle":
        f1, f2 = frame(target), frame(target)
        w64(f1 + F_PREVIOUS, f2)
        w64(f2 + F_PREVIOUS, f1)
        return Scenario(f1)
    if name == "long_cycle":
        ring = [frame(target) for _ in range(100)]
        for f, g in zip(ring, ring[1:] + ring[:1]):
            w64(f + F_PREVIOUS, g)
        return Scenario(ring[0])
    if name == "kernel_frame":
        return Scenario(KERNEL)
    if name == "kernel_previous":
        return Scenario(frame(target, previous=KERNEL + 0x1000))
    if name == "kernel_code":
        return one_frame(KERNEL + 0x2000)
    if name == "code_huge_linetable":
        return one_frame(fake_code(linetable=fake_bytes(b"\x80" * 16, size=1 << 62)))
    if name == "code_negative_linetable":
        return one_frame(fake_code(linetable=fake_bytes(b"\x80" * 16, size=-1)))
    if name == "code_negative_firstlineno":
        return one_frame(fake_code(firstlineno=-7))
    if name == "code_huge_firstlineno":
        return one_frame(fake_code(firstlineno=0x7FFFFFFF))
    if name == "qualname_huge_length":
        return qualname_is(fake_str(length=1 << 60))
    if name == "qualname_negative_length":
        return qualname_is(fake_str(length=-5))
    if name == "qualname_bad_kind":
        return qualname_is(fake_str(state=3 << KIND_SHIFT | COMPACT))
    if name == "qualname_ascii_ucs4":
        return qualname_is(fake_str(state=4 << KIND_SHIFT | COMPACT | ASCII))
    if name == "qualname_noncompact_kernel":
        return qualname_is(fake_str(state=1 << KIND_SHIFT, data_pointer=KERNEL + 0x3000))
    if name == "qualname_not_str":
        return qualname_is(not_a_str())
    if name == "filename_huge_length":
        return one_frame(fake_code(filename=fake_str(length=1 << 40)))
    if name == "linetable_max_varints":
        # The largest table pyperch accepts (1 MiB), and an instruction past its end.
        table = fake_bytes(max_varint_table(1 << 20))
        return one_frame(fake_code(linetable=table), units=0x3FFFFFF0)
    if name == "linetable_churn":
        # A 1 MiB table, and a co_name whose cached hash (the kernel's validation word)
        # changes all the time: no cached symbol is ever valid, every sample reads again.
        table = fake_bytes(max_varint_table(1 << 20))
        name_str = fake_str(text="churning_name")
        s = one_frame(fake_code(linetable=table, name=name_str))
        s.flip, s.flip_len = name_str + S_HASH, 8
        return s
    if name == "qualname_stalled_page":
        return qualname_is(stalled_page(sys.argv[4]))
    raise SystemExit("unknown scenario " + name)


def stalled_page(path):
    """An address in an untouched page of a shared mapping of `path`."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    PROT_READ, MAP_SHARED = 1, 1
    a = libc.mmap(None, 65536, PROT_READ, MAP_SHARED, fd, 0)
    if a in (None, ctypes.c_void_p(-1).value):
        raise SystemExit("mmap: " + os.strerror(ctypes.get_errno()))
    time.sleep(3)
    return a + 0x8000


SCENARIOS = [
    "self_cycle", "two_cycle", "long_cycle", "kernel_frame", "kernel_previous", "kernel_code",
    "code_huge_linetable", "code_negative_linetable", "code_negative_firstlineno",
    "code_huge_firstlineno", "qualname_huge_length", "qualname_negative_length",
    "qualname_bad_kind", "qualname_ascii_ucs4", "qualname_noncompact_kernel",
    "qualname_not_str", "filename_huge_length", "linetable_max_varints", "linetable_churn",
]


def tstate():
    get = ctypes.pythonapi.PyThreadState_Get
    get.restype = ctypes.c_void_p
    return get()


def slot_address():
    """Address of the word holding this thread's current frame, for the caller's frame."""
    offset, cframe_offset = SLOT
    a = tstate() + offset
    if cframe_offset is not None:
        a = r64(a) + cframe_offset
    return a


def spin_forged(lib, scenario, deadline):
    slot = slot_address()
    # Read inline (no Python call in between): this very frame is the current one, and the
    # forged frames' caller.
    real = ctypes.c_uint64.from_address(slot).value
    if V <= (3, 10):
        ok = real == id(sys._getframe())
    else:
        ok = real != 0 and (r64(real + F_CODE) & ~7) == id(spin_forged.__code__)
    if not ok:
        raise SystemExit("forged_memory.py: the current-frame slot is not where this Python keeps it")
    for f in scenario.to_real:
        w64(f + F_PREVIOUS, real)
    while not STOP and time.monotonic() < deadline:
        lib.forge_spin(slot, scenario.top, 0.2, scenario.flip, scenario.flip_len)


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.forge_spin.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_double, ctypes.c_void_p, ctypes.c_size_t]
    lib.forge_spin.restype = ctypes.c_uint64
    name = sys.argv[2]
    max_seconds = float(sys.argv[3])
    scenario = build(name)
    signal.signal(signal.SIGTERM, lambda signum, frame: STOP.append(1))
    os.nice(19)
    print("ready %d scenario=%s" % (os.getpid(), name), flush=True)
    spin_forged(lib, scenario, time.monotonic() + max_seconds)


if __name__ == "__main__":
    main()
