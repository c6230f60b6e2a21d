"""A minimal FUSE file system server, to be stopped (SIGSTOP) so that it never answers.

Usage: fuse_stall.py MOUNTPOINT SIZE[:COUNT]|@FILE [COMMAND...]   (as root; needs /dev/fuse)

In a mount namespace of its own (so that nothing else on the host sees the mount), mounts
a file system holding one regular file, MOUNTPOINT/lib.so, of SIZE bytes (all
b"x"), or a copy of FILE (a real shared library, for a process to load); with :COUNT,
COUNT such files of SIZE bytes, lib.so, lib1.so ... lib<COUNT-1>.so (distinct inodes), speaking the kernel's FUSE protocol directly on /dev/fuse (no library). Lookups and
attributes are never cached by the kernel (validity 0), so every path walk and every
attribute refresh asks the server. COMMAND, if given, is started in that namespace once
the file system answers (e.g. a program that maps MOUNTPOINT/lib.so). Prints
"ready server=PID mapper=PID" once COMMAND maps a file of the mount (mapper=0 without
COMMAND; with COUNT files, once it maps all of them). Once the server is stopped, whoever touches the file system waits for an answer
that never comes (until the server dies, which aborts the connection, or continues).
"""
import ctypes
import ctypes.util
import errno
import os
import struct
import sys
import time

LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 17, 18, 25, 26
OPENDIR, READDIR, RELEASEDIR, ACCESS, INTERRUPT, DESTROY, BATCH_FORGET = 27, 28, 29, 34, 36, 38, 42
ROOT, FILE = 1, 2
NAME = b"lib.so"
COUNT = [1]


def name_of(i):
    return NAME if i == 0 else b"lib%d.so" % i
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr, 88 bytes

def attr(node, size):
    if node == ROOT:
        return ATTR.pack(ROOT, 0, 0, 0, 0, 0, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0)
    return ATTR.pack(node, size, (size + 511) // 512, 0, 0, 0, 0, 0, 0, 0o100644, 1, 0, 0, 0, 4096, 0)


def reply(fd, unique, payload=b"", error=0):
    os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)


def serve(fd, size, content=None):
    while True:
        try:
            request = os.read(fd, (1 << 20) + 4096)
        except OSError as e:
            if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                continue
            return  # ENODEV: unmounted
        _, opcode, unique, node = IN_HEADER.unpack_from(request)[:4]
        body = request[IN_HEADER.size:]
        if opcode == INIT:
            major, minor, max_readahead, flags = struct.unpack_from("<IIII", body)
            out = struct.pack("<IIIIHHIIHH", 7, 31, max_readahead, 0, 16, 12, 1 << 20, 1, 256, 0)
            reply(fd, unique, out.ljust(64, b"\0"))
        elif opcode in (FORGET, BATCH_FORGET, INTERRUPT):
            pass  # no answer expected
        elif opcode == LOOKUP:
            name = body.split(b"\0", 1)[0]
            index = [i for i in range(COUNT[0]) if name_of(i) == name]
            if node == ROOT and index:
                file = FILE + index[0]
                reply(fd, unique, struct.pack("<QQQQII", file, 1, 0, 0, 0, 0) + attr(file, size))
            else:
                reply(fd, unique, error=errno.ENOENT)
        elif opcode == GETATTR:
            reply(fd, unique, struct.pack("<QII", 0, 0, 0) + attr(node, size))
        elif opcode in (OPEN, OPENDIR):
            reply(fd, unique, struct.pack("<QIi", 0, 0, 0))
        elif opcode == READ:
            _, offset, length = struct.unpack_from("<QQI", body)
            if content is None:
                reply(fd, unique, b"x" * max(0, min(length, size - offset)))
            else:
                reply(fd, unique, content[offset:offset + length])
        elif opcode in (RELEASE, RELEASEDIR, FLUSH, ACCESS):
            reply(fd, unique)
        elif opcode == DESTROY:
            reply(fd, unique)
            return
        else:
            reply(fd, unique, error=errno.ENOSYS)


def main():
    mountpoint, size, command = sys.argv[1], sys.argv[2], sys.argv[3:]
    content = None
    if size.startswith("@"):
        with open(size[1:], "rb") as f:
            content = f.read()
        size = len(content)
    else:
        size, _, count = size.partition(":")
        size = int(size)
        COUNT[0] = int(count or "1")
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x20000, 0x4000, 0x40000
    if libc.unshare(CLONE_NEWNS) != 0 or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
    options = "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other" % fd
    if libc.mount(b"pyperch-stall", mountpoint.encode(), b"fuse.pyperch-stall", 6, options.encode()) != 0:
        # MS_NOSUID | MS_NODEV = 6
        sys.exit("mount: " + os.strerror(ctypes.get_errno()))
    pid = os.fork()
    if pid == 0:
        serve(fd, size, content)
        os._exit(0)
    # The parent starts COMMAND once the file system answers, and says when all is set.
    os.stat(os.path.join(mountpoint, NAME.decode()))
    mapper = 0
    if command:
        mapper = os.fork()
        if mapper == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.execvp(command[0], command)
        for _ in range(1000):
            with open("/proc/%d/maps" % mapper) as maps:
                mapped = set(line.split()[-1] for line in maps if mountpoint in line)
                if len(mapped) >= COUNT[0]:
                    break
            time.sleep(0.01)
        else:
            sys.exit("%s did not map a file of %s" % (command[0], mountpoint))
    print("ready server=%d mapper=%d" % (pid, mapper), flush=True)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
