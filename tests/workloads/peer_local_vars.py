"""py-spy's "local_vars" case, written anew (standard library values only; py-spy's numpy
scalars are left out, no numpy being installed for every test interpreter):
local_variable_lookup() has three arguments with defaults and eight locals, then sleeps.

Usage: peer_local_vars.py [MAX_SECONDS]    (default 120)

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import time


def local_variable_lookup(seconds, arg1="foo", arg2=None, arg3=True):
    local1 = [-1234, 5678]
    local2 = ("a", "b", "c")
    local3 = 123456789123456789
    local4 = 3.1415
    local5 = {"a": False, "b": (1, 2, 3)}
    local6 = ("-" * 115, {"key": {"key": {"key": "value"}}})
    local25 = "\u6d4b\u8bd51" * 500
    local26 = ""
    print("ready", os.getpid(), flush=True)
    time.sleep(seconds)  # @sleep


local_variable_lookup(float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)  # @module
