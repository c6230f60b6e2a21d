"""The peers' and pyperch's outputs taken apart: every tool's profile becomes
[(frames root->leaf, count)], frames as bare function names (qualnames reduced to their last
part), pseudo-frames removed; the tools' stderr summaries; their versions."""
import os
import re

from .children import sh
from .common import BASE_TOOL


# ---------------------------------------------------------------------------------------
# Profile parsers: every tool's output becomes [(frames root->leaf, count)], frames as bare
# function names (qualnames reduced to their last part), pseudo-frames removed.


def norm_name(name):
    name = name.strip()
    if name.startswith("<") and name.endswith(">"):
        return name
    return name.rsplit(".", 1)[-1]


PSEUDO = {"<GC>", "<native>", "<interpreter trampoline>", "<shim>"}


def parse_paren_frames(stack):
    """pyperch collapsed and py-spy raw: `name (file:line)` frames."""
    frames = []
    for fr in stack.split(";"):
        m = re.match(r"^(.*) \(([^()]*)\)$", fr)
        if m:
            if re.match(r"^pid \d+$", m.group(2)):
                continue  # pyperch's process frame
            name = m.group(1)
        else:
            name = fr
            if re.match(r"^(thread|process) ", fr):
                continue
        name = norm_name(name)
        if name not in PSEUDO:
            frames.append(name)
    return frames


def parse_colon_frames(stack):
    """Austin and CPython collapsed: `file:name:line` frames (plus P/T/tid: prefixes)."""
    frames = []
    for fr in stack.split(";"):
        if re.match(r"^(P\d+|T\d+:\d+|T\d+|tid:\d+)$", fr):
            continue
        parts = fr.rsplit(":", 2)
        name = parts[1] if len(parts) == 3 else fr
        name = norm_name(name)
        if name not in PSEUDO:
            frames.append(name)
    return frames


def parse_profile(tool, path):
    tool = BASE_TOOL.get(tool, tool)
    stacks = []
    if not os.path.exists(path):
        return stacks
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if tool == "austin":
                # One line per sample; the trailing number is the sample's CPU time in us.
                stack = line.rsplit(" ", 1)[0] if " " in line else line
                stacks.append((parse_colon_frames(stack), 1))
                continue
            if " " not in line:
                continue
            stack, count = line.rsplit(" ", 1)
            try:
                n = int(count)
            except ValueError:
                continue
            if tool == "cpython":
                stacks.append((parse_colon_frames(stack), n))
            else:
                stacks.append((parse_paren_frames(stack), n))
    return stacks


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_tool_stderr(tool, text):
    tool = BASE_TOOL.get(tool, tool)
    text = ANSI.sub("", text)
    info = {}
    if tool == "pyperch":
        m = re.search(r"recorded ([\d.]+) s: (\d+) samples \((\d+) ok\) from (\d+) Python process", text)
        if m:
            info.update(recorded_s=float(m.group(1)), samples=int(m.group(2)), ok=int(m.group(3)), processes=int(m.group(4)))
        whole = text.split("  process ", 1)[0]
        m = re.search(r"kernel: (\d+) samples of registered processes, (\d+) lost", whole)
        if m:
            info.update(kernel_samples=int(m.group(1)), kernel_lost=int(m.group(2)))
        m = re.search(r"target memory: (\d+) reads, (\d+) bytes", whole)
        if m:
            info.update(target_reads=int(m.group(1)), target_bytes=int(m.group(2)))
        m = re.search(r"ring buffer: (\d+) bytes", whole)
        if m:
            info.update(ring_bytes=int(m.group(1)))
        m = re.search(r"native: (\d+) merged \((\d+) with a truncated native stack\), (\d+) unmerged", whole)
        if m:
            info.update(native_merged=int(m.group(1)), native_truncated=int(m.group(2)), native_unmerged=int(m.group(3)))
        m = re.search(r"frames from kernel (\d+), from cache (\d+), from memory (\d+)", whole)
        if m:
            info.update(frames_kernel=int(m.group(1)), frames_cache=int(m.group(2)), frames_memory=int(m.group(3)))
        outcomes = {}
        for mm in re.finditer(r"^    (\S[^\n]*?)\s+(\d+) \(\s*[\d.]+%\)", whole, re.M):
            outcomes[mm.group(1).strip()] = int(mm.group(2))
        info["outcomes"] = outcomes
        per = {}
        detail = {}
        for block in re.split(r"^  process ", text, flags=re.M)[1:]:
            mm = re.match(r"(\d+) \(([^)]*)\):", block)
            if not mm:
                continue
            pid = int(mm.group(1))
            d = {"name": mm.group(2), "outcomes": {}}
            ms = re.search(r"^    samples: (\d+)", block, re.M)
            d["samples"] = int(ms.group(1)) if ms else 0
            for mo in re.finditer(r"^      (\S[^\n]*?)\s+(\d+) \(\s*[\d.]+%\)", block, re.M):
                d["outcomes"][mo.group(1).strip()] = int(mo.group(2))
            d["ok"] = d["outcomes"].get("ok", 0)
            per[pid] = d["samples"]
            detail[pid] = d
        info["per_process"] = per
        info["per_process_detail"] = detail
        info["registered"] = len(re.findall(r"^  process \d+ ", text, re.M))
    elif tool in ("py-spy", "py-spy-nb"):
        m = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        if m:
            info.update(samples=int(m.group(1)), errors=int(m.group(2)))
        info["behind_warnings"] = len(re.findall(r"behind", text))
    elif tool == "austin":
        m = re.search(r"Error rate\s*:\s*(\d+)/(\d+)", text)
        if m:
            info.update(errors=int(m.group(1)), attempts=int(m.group(2)))
        m = re.search(r"Long sampling rate\s*:\s*(\d+)/(\d+)", text)
        if m:
            info.update(long_samples=int(m.group(1)))
        m = re.search(r"Sampling duration\s*:\s*([\d.]+) s", text)
        if m:
            info.update(sampling_s=float(m.group(1)))
        m = re.search(r"Frame sampling \(min/avg/max\)\s*:\s*(\d+)/(\d+)/(\d+)", text)
        if m:
            info.update(frame_sampling_avg_us=int(m.group(2)))
    elif tool == "cpython":
        m = re.search(r"Captured (\d+) samples in ([\d.]+) seconds", text)
        if m:
            info.update(samples=int(m.group(1)), seconds=float(m.group(2)))
        m = re.search(r"Error rate: ([\d.]+)", text)
        if m:
            info.update(error_rate_pct=float(m.group(1)))
        m = re.search(r"missed (\d+) samples from the expected total of (\d+)", text)
        if m:
            info.update(missed=int(m.group(1)), expected=int(m.group(2)))
    return info


def tool_versions(b):
    v = {}
    v["pyperch"] = sh("%s --version" % b.o.pyperch)
    v["py-spy"] = sh("%s/py-spy --version" % b.venv_bin).replace("py-spy ", "")
    v["austin"] = sh("%s/austin --version" % b.venv_bin).replace("austin ", "")
    if b.rootfs:
        v["cpython"] = sh("chroot %s /usr/bin/python3.15 -c 'import sys; print(sys.version.split()[0])'" % b.rootfs)
    return v
