#!/usr/bin/env python3
"""The short table `make test-gpu` prints last (scripts/test-gpu.sh): one line per step, from the files the steps
left in the results folder (selftest.json, registry-<test>.json from GoogleTest, one per device test,
bench.status, peers.status, <tool>.status, python.status)."""
import json
import os
import sys


def registry_line(path):
    if not os.path.exists(path):
        return "not run (no JSON: crashed or timed out? see the .txt beside it)"
    with open(path) as f:
        g = json.load(f)
    failures = 0
    first = None
    notes = []
    for suite in g.get("testsuites", []):
        for t in suite.get("testsuite", []):
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                return "skipped (" + (t.get("skipped", [{}]) or [{}])[0].get("message", "no device").strip() + ")"
            for key in ("cudnn_cases", "cudnn_refused", "backward_cases", "backward_refused"):
                if key in t:
                    notes.append(f"{key.replace('_', ' ')} {t[key]}")
            for fail in t.get("failures", []):
                failures += 1
                first = first or fail.get("failure", "").splitlines()[0:3]
    extra = f"; {', '.join(notes)}" if notes else ""
    if failures:
        return f"FAIL: {failures} failed assertions; first: {' / '.join(first or [])}{extra}"
    return f"pass{extra}"


def main():
    results = sys.argv[1]
    sanitize_cases = sys.argv[2] if len(sys.argv) > 2 else "?"
    rows = []
    device = "?"
    path = os.path.join(results, "selftest.json")
    if os.path.exists(path):
        with open(path) as f:
            s = json.load(f)
        device = s.get("device") or "?"
        checks = s.get("checks", [])
        bad = [c["name"] for c in checks if c.get("failures")]
        rows.append(("layout self-test (mma, ldmatrix, tiles)",
                     f"{s.get('status')} ({len(checks)} checks" + (f"; failed: {', '.join(bad)}" if bad else "") + ")"))
    else:
        rows.append(("layout self-test (mma, ldmatrix, tiles)", "not run"))
    tests_status = os.path.join(results, "tests.status")
    if os.path.exists(tests_status):
        with open(tests_status) as f:
            rows.append(("registry on the GPU, compute-sanitizer", f.read().strip()))
    else:
        found = sorted(f for f in os.listdir(results) if f.startswith("registry-") and f.endswith(".txt"))
        for txt in found:
            name = txt[len("registry-"):-len(".txt")]
            rows.append((f"GPU: {name}", registry_line(os.path.join(results, f"registry-{name}.json"))))
        if not found:
            rows.append(("registry on the GPU vs the fp64 reference", "not run"))
        for tool in ("memcheck", "racecheck"):
            p = os.path.join(results, f"{tool}.status")
            text = open(p).read().strip() if os.path.exists(p) else "not run"
            rows.append((f"compute-sanitizer {tool} (first {sanitize_cases} cases)", text))
    for name, key in (("benchmark (attn_gpu_bench)", "bench"), ("PyTorch SDPA peers, fp64 at full size", "peers"),
                      ("Python on torch CUDA tensors (test_cuda.py)", "python")):
        p = os.path.join(results, f"{key}.status")
        rows.append((name, open(p).read().strip() if os.path.exists(p) else "not run"))
    width = max(len(r[0]) for r in rows)
    print(f"\nmake test-gpu on {device}")
    for name, result in rows:
        print(f"  {name:<{width}}  {result}")
    print(f"  (files in {results})")


if __name__ == "__main__":
    main()
