#!/usr/bin/env python3
"""ctest ring.bench_np2: runs `attn ring-bench` (the command after --) and checks its report's values, not only its
shape: one row per rank holding S / ranks tokens, the FLOP count of the cost model (4·S²·Hq·D, halved when
causal), hidden fractions in [0, 100] %, the overlap line equal to their mean and minimum, and a positive
prediction from the planner. Timings themselves are not checked (the machine is shared).

usage: ring_bench_check.py --seq S --ranks N -- COMMAND..."""
import re
import subprocess
import sys


def main():
    args = sys.argv[1:]
    cut = args.index("--")
    opts, command = args[:cut], args[cut + 1:]
    seq, ranks = int(opts[opts.index("--seq") + 1]), int(opts[opts.index("--ranks") + 1])
    run = subprocess.run(command, capture_output=True, text=True)
    out = run.stdout
    print(out, run.stderr, sep="\n")
    errors = []
    if run.returncode != 0:
        errors.append("exit status %d" % run.returncode)
    head = re.search(r"ring-bench: (\d+) ranks, S=(\d+) \(\w+, (causal|full)\), B=(\d+) Hq=(\d+) Hkv=\d+ D=(\d+)", out)
    if not head:
        errors.append("no header line")
    else:
        n, s, causal, b, hq, d = int(head[1]), int(head[2]), head[3] == "causal", int(head[4]), int(head[5]), int(head[6])
        if (n, s) != (ranks, seq):
            errors.append("header says %d ranks, S=%d; expected %d, %d" % (n, s, ranks, seq))
        rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)%$", out, re.M)
        if sorted(int(r[0]) for r in rows) != list(range(ranks)):
            errors.append("rank rows %s; expected ranks 0..%d" % ([r[0] for r in rows], ranks - 1))
        if any(int(r[1]) != seq // ranks for r in rows):
            errors.append("tokens per rank %s; expected %d" % ([r[1] for r in rows], seq // ranks))
        hidden = [float(r[2]) for r in rows]
        if any(not 0 <= h <= 100 for h in hidden):
            errors.append("hidden fractions %s outside [0, 100] %%" % hidden)
        flop = re.search(r"s \(median of \d+\), ([0-9.e+]+) FLOP", out)
        want = 4.0 * b * seq * seq * hq * d / (2 if causal else 1)
        if not flop or abs(float(flop[1]) - want) > 0.005 * want:
            errors.append("FLOP %s; expected %.3g" % (flop[1] if flop else "missing", want))
        overlap = re.search(r"overlap: ([0-9.]+)% of communication hidden behind compute \(mean over ranks; lowest ([0-9.]+)%\)", out)
        if not overlap or not hidden:
            errors.append("no overlap line")
        else:
            mean, low = sum(hidden) / len(hidden), min(hidden)
            if abs(float(overlap[1]) - mean) > 0.1 or abs(float(overlap[2]) - low) > 0.05:
                errors.append("overlap %s%% / lowest %s%%; the rows give %.2f%% / %.1f%%" % (overlap[1], overlap[2], mean, low))
        plan = re.search(r"planner .*: predicted ([0-9.e+-]+) s, measured ([0-9.e+-]+) s", out)
        if not plan or not float(plan[1]) > 0 or not float(plan[2]) > 0:
            errors.append("no positive prediction and measurement from the planner")
    for e in errors:
        print("ring_bench_check: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
