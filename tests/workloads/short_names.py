"""Spends its time in a module installed in a virtualenv-shaped site-packages directory
(DIR/venv/lib/pythonX.Y/site-packages/shortmod.py, written by this script) and in the
standard library's textwrap module, for about SECONDS (default 30).

Usage: short_names.py DIR [SECONDS]

Runs unchanged on CPython 3.8 ... 3.15 (stdlib only).
"""
import os
import sys
import textwrap
import time

MODULE = '''
def shortmod_work(deadline, wrap):
    text = "lorem ipsum dolor sit amet " * 40
    while deadline():
        wrap(text, 30)
'''


def main():
    directory = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    site = os.path.join(directory, "venv", "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "shortmod.py"), "w") as f:
        f.write(MODULE)
    sys.path.insert(0, site)
    import shortmod

    print("ready site=%s" % site, flush=True)
    end = time.monotonic() + seconds
    shortmod.shortmod_work(lambda: time.monotonic() < end, textwrap.wrap)


if __name__ == "__main__":
    main()
