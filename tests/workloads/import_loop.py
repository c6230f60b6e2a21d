"""Imports 40 standard-library modules in a loop, dropping them again after every round.

Usage: import_loop.py SECONDS RESULT_JSON

Each round imports the modules below (and what they import), then deletes every module the
round added from sys.modules, so the next round imports them all again: their module bodies,
class bodies and functions are created, run and freed within milliseconds, the short-lived
code objects of a program's start-up and of `import numpy`. Stops after SECONDS (at least
one round). Then writes RESULT_JSON: {"rounds": N, "codes": {file: {name: [lines]}}}, every
code object of every module the process imported (and of this script), recompiled from the
modules' own loaders, by co_filename and name (co_qualname, co_name before 3.11), with the
lines its instructions have, and its first line: the frames this process can have run.
Runs on CPython 3.8 ... 3.15.
"""
import importlib
import json
import sys
import time
import types

MODULES = [
    "json", "csv", "decimal", "fractions", "statistics", "textwrap", "string", "difflib",
    "pprint", "argparse", "dataclasses", "enum", "typing", "ipaddress", "email.message",
    "email.parser", "http.client", "urllib.parse", "urllib.request", "xml.dom.minidom",
    "xml.etree.ElementTree", "html.parser", "configparser", "logging", "tarfile", "zipfile",
    "gzip", "shutil", "tempfile", "calendar", "datetime", "uuid", "hashlib", "hmac",
    "secrets", "base64", "pickle", "copy", "heapq", "bisect",
]

SECONDS = float(sys.argv[1])
RESULT = sys.argv[2]

deadline = time.monotonic() + SECONDS
base = set(sys.modules)
seen = {}
rounds = 0
while rounds == 0 or time.monotonic() < deadline:
    for name in MODULES:
        importlib.import_module(name)
    for name in list(sys.modules):
        if name not in base:
            if rounds == 0:
                seen[name] = getattr(sys.modules[name], "__spec__", None)
            del sys.modules[name]
    rounds += 1

for name, module in list(sys.modules.items()):
    seen.setdefault(name, getattr(module, "__spec__", None))


def lines_of(code):
    if hasattr(code, "co_lines"):
        found = {line for _, _, line in code.co_lines() if line is not None}
    else:
        import dis
        found = {line for _, line in dis.findlinestarts(code)}
    found.add(code.co_firstlineno)
    return found


codes = {}


def add(code):
    name = getattr(code, "co_qualname", code.co_name)
    codes.setdefault(code.co_filename, {}).setdefault(name, set()).update(lines_of(code))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            add(const)


for name, spec in seen.items():
    loader = getattr(spec, "loader", None)
    try:
        code = loader.get_code(name) if loader is not None else None
    except Exception:
        code = None
    if code is not None:
        add(code)
with open(__file__) as f:
    add(compile(f.read(), __file__, "exec"))
with open(RESULT, "w") as f:
    json.dump({"rounds": rounds, "codes": {file: {n: sorted(l) for n, l in names.items()} for file, names in codes.items()}}, f)
