"""Samples kept during imports: for 1 s the program imports 40 standard-library modules,
removes them from sys.modules, and does it again (each round compiles and runs the modules'
code anew: code objects are created and freed all the time)."""
import sys
import time

MODULES = [
    "json", "csv", "decimal", "fractions", "statistics", "textwrap", "difflib", "heapq", "bisect", "calendar",
    "string", "shlex", "fnmatch", "glob", "tempfile", "gettext", "locale", "argparse", "pprint", "reprlib",
    "enum", "dataclasses", "typing", "numbers", "colorsys", "ipaddress", "uuid", "base64", "binascii", "quopri",
    "html", "html.parser", "xml.dom.minidom", "email.message", "mimetypes", "zipfile", "tarfile", "configparser",
    "queue", "sched",
]
before = set(sys.modules)
end = time.perf_counter() + 1.0
rounds = 0
while time.perf_counter() < end:
    for name in MODULES:
        __import__(name)
    for name in list(sys.modules):
        if name not in before:
            del sys.modules[name]
    rounds += 1
print("rounds", rounds)
