"""Short-lived Python children in waves, then more at once than a small process map holds.

Usage: slots.py WAVES PER_WAVE WAVE_MS LATE LATE_MS RESULT_JSON

Wave w starts PER_WAVE children spinning in `wave_<w>` for WAVE_MS of CPU time and waits for
them. Then LATE children spin in `late_<k>` at once: the first PER_WAVE for LATE_MS / 3, the
others for LATE_MS, so the later ones can take the slots the earlier ones free. Writes
{"waves", "per_wave", "late", "children"} to RESULT_JSON. Prints "ready <pid>" first.
"""
import json
import os
import subprocess
import sys
import time

WAVES, PER_WAVE, WAVE_MS, LATE, LATE_MS = (int(a) for a in sys.argv[1:6])
RESULT = sys.argv[6]
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spin_named.py")


def start(name, ms):
    return subprocess.Popen([sys.executable, CHILD, name, str(ms)])


print("ready %d" % os.getpid(), flush=True)
time.sleep(0.5)
children = 0
for w in range(WAVES):
    wave = [start("wave_%d" % w, WAVE_MS) for _ in range(PER_WAVE)]
    for c in wave:
        c.wait()
    children += len(wave)
late = [start("late_%d" % k, LATE_MS // 3 if k < PER_WAVE else LATE_MS) for k in range(LATE)]
for c in late:
    c.wait()
children += len(late)
with open(RESULT, "w") as f:
    json.dump({"waves": WAVES, "per_wave": PER_WAVE, "late": LATE, "children": children}, f)
