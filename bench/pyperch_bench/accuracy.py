"""Accuracy: a profile's stacks against the truth a workload carries."""



# ---------------------------------------------------------------------------------------
# Accuracy.

LEAF_LABELS = {
    "chain": {"leaf_a": ["leaf_a"], "leaf_b": ["leaf_b"]},
    "recursion": {"leaf_a": ["leaf_a"], "leaf_b": ["leaf_b"]},
    "threads8": {"work_t%d" % k: ["work_t%d" % k, "spin_t%d" % k] for k in range(8)},
    "web": {"render_page": ["render_page"], "encode_payload": ["encode_payload"]},
    "frame_reuse": {"a": ["a_1", "a_2", "a_3"], "b": ["b_1", "b_2", "b_3"]},
    "numpy_mix": {"matmul": ["matmul_line"], "fft": ["fft_line"]},
}


def expected_prefix(workload, depth=None):
    if workload == "chain":
        return ["<module>", "main"] + ["chain_%02d" % i for i in range(30)] + ["split_loop"]
    if workload == "recursion":
        return ["<module>", "main"] + ["descend"] * (depth - 4) + ["split_loop"]
    if workload == "web":
        return ["<module>", "main", "serve", "handle_request"]
    if workload == "frame_reuse":
        return ["<module>", "main", "reuse_loop"]
    return None


def full_stack(workload, frames, depth=None):
    """Does this sample show the whole stack: the right root and, when it is in the hot
    part of the workload, every frame expected above it?"""
    if "_snapshot" in frames:
        # The harness's signal handler, running on top of whatever was executing.
        frames = frames[:frames.index("_snapshot")]
    if not frames:
        return False
    if workload == "threads8":
        if frames[0] == "_bootstrap":
            hit = [k for k in range(8) if "work_t%d" % k in frames]
            if not hit:
                return True
            k = hit[0]
            i = frames.index("work_t%d" % k)
            return frames[i - 1] == "run" and frames[i + 1:i + 2] in ([], ["spin_t%d" % k])
        return frames[0] == "<module>"
    if frames[0] != "<module>":
        return False
    if workload in ("chain", "recursion"):
        if "split_loop" in frames or "leaf_a" in frames or "leaf_b" in frames:
            pre = expected_prefix(workload, depth)
            return frames[:len(pre)] == pre
        return True
    if workload == "web":
        if "render_page" in frames or "encode_payload" in frames:
            pre = expected_prefix(workload)
            return frames[:len(pre)] == pre
        return True
    if workload == "frame_reuse":
        rest = [f for f in frames]
        if any(f in ("a_1", "a_2", "a_3", "b_1", "b_2", "b_3", "leaf") for f in rest):
            pre = expected_prefix(workload)
            if frames[:len(pre)] != pre:
                return False
            tail = frames[len(pre):]
            for chain in (["a_1", "a_2", "a_3", "leaf"], ["b_1", "b_2", "b_3", "leaf"]):
                if tail == chain[:len(tail)] and tail:
                    return True
            return False
        return True
    return True


def accuracy(workload, stacks, truth_cpu, depth=None):
    labels = LEAF_LABELS[workload]
    total = sum(n for _, n in stacks)
    counts = {k: 0 for k in labels}
    mixed = 0
    full = 0
    for frames, n in stacks:
        fs = set(frames)
        hit = [k for k, marks in labels.items() if any(m in fs for m in marks)]
        if len(hit) == 1:
            counts[hit[0]] += n
        elif len(hit) > 1:
            mixed += n
        if full_stack(workload, frames, depth):
            full += n
    labelled = sum(counts.values())
    if workload == "frame_reuse":
        truth = {k: 1.0 / len(labels) for k in labels}
    else:
        tot = sum(max(0.0, truth_cpu.get(k, 0.0)) for k in labels)
        truth = {k: (max(0.0, truth_cpu.get(k, 0.0)) / tot if tot > 0 else None) for k in labels}
    measured = {k: (counts[k] / labelled if labelled else None) for k in labels}
    errors = [abs(measured[k] - truth[k]) for k in labels if measured[k] is not None and truth[k] is not None]
    err_pp = 100.0 * max(errors) if errors and len(errors) == len(labels) else None
    # Sampling noise of one share at this many samples (1 standard error, percentage points).
    p = 1.0 / len(labels) if workload != "chain" and workload != "recursion" else 0.3
    noise_pp = 100.0 * (p * (1 - p) / labelled) ** 0.5 if labelled else None
    return {
        "samples": total,
        "labelled": labelled,
        "truth": truth,
        "measured": measured,
        "split_error_pp": err_pp,
        "noise_pp": noise_pp,
        "full_stack_share": (full / total if total else None),
        "mixed": mixed,
        "mixed_share": (mixed / total if total else None),
        "mixed_share_of_chain": (mixed / (labelled + mixed) if labelled + mixed else None),
    }
