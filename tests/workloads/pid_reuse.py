"""A process exits and its PID is given to a successor with another name (needs root).

Usage: pid_reuse.py OLD_MS NEW_MS RESULT_JSON

Starts `pyold` (a symlink to this interpreter, so its comm is "pyold") spinning in
`old_work` for OLD_MS of CPU time and waits for it. Then it writes OLD_PID - 1 to
/proc/sys/kernel/ns_last_pid and starts `pynew` (spinning in `new_work` for NEW_MS), until
the successor gets the very same PID (other processes on the host may take it first: up to
200 tries). Writes {"old": pid, "new": pid, "reused": bool, "tries": n} to RESULT_JSON.
Prints "ready <pid>" first.
"""
import json
import os
import subprocess
import sys
import time

OLD_MS, NEW_MS, RESULT = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "spin_named.py")
for name in ("pyold", "pynew"):
    link = os.path.join(HERE, name)
    if not os.path.lexists(link):
        os.symlink(sys.executable, link)

print("ready %d" % os.getpid(), flush=True)
time.sleep(0.5)
old = subprocess.Popen([os.path.join(HERE, "pyold"), CHILD, "old_work", OLD_MS])
old.wait()
tries = 0
new = None
while tries < 200:
    tries += 1
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(old.pid - 1))
    except OSError:
        pass
    new = subprocess.Popen([os.path.join(HERE, "pynew"), CHILD, "new_work", NEW_MS])
    if new.pid == old.pid:
        break
    new.kill()
    new.wait()
    new = None
if new is None:
    new = subprocess.Popen([os.path.join(HERE, "pynew"), CHILD, "new_work", NEW_MS])
new.wait()
with open(RESULT, "w") as f:
    json.dump({"old": old.pid, "new": new.pid, "reused": old.pid == new.pid, "tries": tries}, f)
