#!/usr/bin/env python3
"""attn benchmarks: the canonical shapes of docs/DESIGN.md for attn and PyTorch SDPA side by side, and a
scaling sweep of time against sequence length.

    python3 bench/run_bench.py                       # every shape, fp32 and bf16 (+ fp16 K/V for decode)
    python3 bench/run_bench.py --shapes P1,D1 --quick
    python3 bench/run_bench.py --install-torch       # torch + matplotlib into bench/.venv first (PyPI)
    python3 bench/run_bench.py --self-test           # a dry run on tiny shapes (no torch needed)
    python3 bench/run_bench.py --backward            # the backward pass: P1, P2 vs SDPA + .backward()
    python3 bench/run_bench.py --install-ipex        # Intel Extension for PyTorch into bench/.venv-ipex first
    python3 bench/run_bench.py --install-ggml        # llama.cpp's ggml flash attention into bench/.ggml first

attn is timed by `attn bench --json` (one process per dtype, so the ceilings it measures are shared by
its shapes); PyTorch's torch.nn.functional.scaled_dot_product_attention runs in this process with the
same shapes, dtype, thread count and number of K/V sets rotated between runs. Results go to a markdown
table (bench/results.md), a JSON file (bench/results.json) and a log-log plot (bench/scaling.png).
Only the standard library is required; torch and matplotlib are used when importable.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
VENV = BENCH_DIR / ".venv"
IPEX_VENV = BENCH_DIR / ".venv-ipex"  # Intel Extension for PyTorch pins its own torch: a venv of its own
IPEX_PINS = ["torch==2.8.0", "intel-extension-for-pytorch==2.8.0", "numpy", "psutil"]
# llama.cpp's ggml: its sources as vendored by PyPI's llama-cpp-python sdist, built with bench/ggml_peer/
GGML_DIR = BENCH_DIR / ".ggml"
GGML_PIN = "llama-cpp-python==0.3.36"
GGML_PEER = GGML_DIR / "build" / "ggml_peer"
# attn's K/V dtype -> the llama.cpp cache type of the same row (-ctk/-ctv): int8 -> q8_0, int4 -> q4_0 (blocks of 32,
# an f16 scale each)
GGML_KV = {"f32": "f32", "bf16": "bf16", "f16": "f16", "i8": "q8_0", "i4": "q4_0"}
GGML_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}

# docs/DESIGN.md's canonical shapes, read from the attn program (`attn bench --list-shapes`, the one table:
# tools/canonical_shapes.h) by load_shapes(): SHAPES holds the full dimensions, TINY the small stand-ins of the
# same kinds that --self-test runs, DECODE the ids of the decode shapes (Sq = 1). kv_min > 0: ragged key
# lengths spread evenly from kv_min to Skv.
SHAPE_IDS = ("P1", "P2", "P3", "D1", "D2", "D3", "X1", "M1", "M2", "M3", "M4")
SHAPES, TINY, DECODE = {}, {}, set()


def load_shapes(attn):
    out = subprocess.run([str(attn), "bench", "--list-shapes"], check=True, capture_output=True, text=True).stdout

    def dims(d):
        return dict(B=d["B"], Hq=d["Hq"], Hkv=d["Hkv"], Sq=d["Sq"], Skv=d["Skv"], D=d["D"], Dv=d["Dv"],
                    latent=d["latent"], causal=d["causal"], page=d["page_size"], kv_min=d["kv_len_min"])

    for line in out.splitlines():
        o = json.loads(line)
        SHAPES[o["id"]], TINY[o["id"]] = dims(o["full"]), dims(o["tiny"])
        if o["full"]["Sq"] == 1:
            DECODE.add(o["id"])
    if tuple(SHAPES) != SHAPE_IDS:
        raise RuntimeError(f"{attn} lists the shapes {tuple(SHAPES)}; this script knows {SHAPE_IDS}")


# (label, Q/O dtype, K/V dtype, which shapes)
CONFIGS = [
    ("fp32", "f32", "f32", None),
    ("bf16", "bf16", "bf16", None),
    ("fp32 Q, fp16 K/V", "f32", "f16", DECODE),
    ("bf16 Q, int8 K/V", "bf16", "i8", DECODE),
    ("bf16 Q, int4 K/V", "bf16", "i4", DECODE),
]

# What every `attn bench --json` object must carry (documented in docs/benchmarks.md).
BENCH_KEYS = (
    "tool label shape backend isa kernel B Hq Hkv Sq Skv Dk Dv causal dtype kv_dtype page_size kv_len_min kv_tokens "
    "threads warmup reps kv_sets kv_set_bytes huge_pages time_median_s time_min_s time_max_s times_s flops flops_nominal "
    "gflops bytes gbps ceilings frac_fma frac_amx frac_bf16_dot frac_read_bw paged_read frac_paged_read bound frac_bound "
    "rss_before_inputs_bytes "
    "rss_with_inputs_bytes peak_rss_bytes extra_rss_bytes peak_rss_scope maxrss_bytes inputs_huge_page_fraction "
    "output_finite cpu"
).split()
CEILING_KEYS = ("threads fma_gflops fma_isa amx_bf16_gflops amx_note bf16_dot_gflops bf16_dot_note read_gbps "
                "read_buffer_bytes huge_pages seconds read_setup_seconds fma_trials read_trials bf16_dot_trials "
                "fma_spread read_spread given").split()

SCALING_N = [512 * 2**i for i in range(7)]  # 512 .. 32768
SCALING_PREFILL = dict(B=1, Hq=4, Hkv=1, D=128, causal=True)  # one head group of P1
SCALING_DECODE = dict(B=1, Hq=32, Hkv=8, Sq=1, D=128, causal=False)  # D1's heads
REFERENCE_MAX_N = 2048  # attn's fp64 reference materialises Sq x Skv scores: O(N^2) memory and slow


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- attn ------------------------------------------------------------------------------------------------


def kv_len(shape, b):
    """Key length of sequence b; the same formula as bench/harness/cmd_bench.cc."""
    if shape["kv_min"] <= 0 or shape["B"] == 1:
        return shape["Skv"]
    lo, hi, B = shape["kv_min"], shape["Skv"], shape["B"]
    return lo + ((hi - lo) * b + (B - 1) // 2) // (B - 1)


def rotation_sets(set_bytes, llc):
    """How many K/V sets of set_bytes a peer rotates between calls so that together they exceed twice the
    last-level cache (llc > 0: decode rows; 0: one set), within half the available memory."""
    if llc <= 0:
        return 1
    sets = max(1, math.ceil(2 * llc / set_bytes))
    avail = available_memory()
    return max(1, min(sets, int((avail // 2) // set_bytes))) if avail else sets


def dims_args(shape):
    a = ["--batch", shape["B"], "--heads", shape["Hq"], "--kv-heads", shape["Hkv"], "--q-len", shape["Sq"],
         "--kv-len", shape["Skv"], "--head-dim", shape["D"]]
    if shape.get("Dv", shape["D"]) != shape["D"]:
        a += ["--value-dim", shape["Dv"]]
    if shape.get("latent"):
        a.append("--latent")
    if shape["causal"]:
        a.append("--causal")
    if shape["page"]:
        a += ["--paged", shape["page"]]
    if shape["kv_min"]:
        a += ["--kv-len-min", shape["kv_min"]]
    return [str(x) for x in a]


def hp_flag(args):
    return ["--no-huge-pages"] if args.no_huge_pages else []


def run_attn(attn, args):
    """Runs `attn bench ... --json` and returns its JSON objects (one per run)."""
    cmd = [str(attn), "bench", "--json"] + [str(a) for a in args]
    log("  $ " + " ".join(cmd))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    runs = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    for r in runs:
        check_bench_json(r)
    return runs


def check_bench_json(r):
    missing = [k for k in BENCH_KEYS if k not in r]
    if missing:
        raise RuntimeError(f"attn bench JSON lacks {missing}: {r}")
    if r["ceilings"] is not None:
        missing = [k for k in CEILING_KEYS if k not in r["ceilings"]]
        if missing:
            raise RuntimeError(f"attn bench ceilings lack {missing}: {r['ceilings']}")
    if r["reps"] != len(r["times_s"]) or r["reps"] < 1:
        raise RuntimeError(f"attn bench: reps {r['reps']} but {len(r['times_s'])} times")
    if not r["output_finite"]:
        raise RuntimeError(f"attn bench: non-finite output for {r['label']}")


def attn_info(attn):
    p = subprocess.run([str(attn), "info", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"attn info failed: {p.stderr.strip()}")
    return json.loads(p.stdout)


# ---- PyTorch ---------------------------------------------------------------------------------------------


def import_torch():
    try:
        import torch  # noqa: F401
        return torch
    except Exception:  # ImportError, or a broken install
        return None


def available_memory():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Peer:
    """PyTorch SDPA on the CPU."""

    def __init__(self, torch, threads, llc_bytes):
        self.torch = torch
        self.threads = threads
        self.llc = llc_bytes
        torch.set_num_threads(threads)
        self.F = torch.nn.functional
        self.gqa = self._has_enable_gqa()
        self.notes = []

    def _has_enable_gqa(self):
        t = self.torch
        q = t.zeros(1, 2, 1, 4)
        k = t.zeros(1, 1, 1, 4)
        try:
            self.F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
            return True
        except TypeError:
            return False

    def dtype(self, name):
        return {"f32": self.torch.float32, "bf16": self.torch.bfloat16, "f16": self.torch.float16}[name]

    def time(self, shape, q_dtype, kv_dtype, reps, rotate):
        """Median seconds of SDPA on `shape`, rotating K/V sets like attn when `rotate` (decode)."""
        t, F = self.torch, self.F
        # SDPA takes one dtype for Q, K and V: with 16-bit K/V and fp32 Q it runs everything in the K/V dtype; it has
        # no 8- or 4-bit K/V, so against attn's int8 and int4 caches it runs in Q's dtype (what its user would run).
        dt = self.dtype(q_dtype if kv_dtype in (q_dtype, "i8", "i4") else kv_dtype)
        B, Hq, Hkv, Sq, Skv, D = (shape[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
        Dv, latent = shape.get("Dv", D), shape.get("latent", False)
        gen = t.Generator().manual_seed(1)

        def rand(*size):
            return (t.rand(*size, generator=gen, dtype=t.float32) * 2 - 1).to(dt)

        row = D if latent else D + Dv  # values per cached token and KV head (a latent V is in K's rows)
        sets = rotation_sets(B * Hkv * Skv * row * t.finfo(dt).bits // 8, self.llc if rotate else 0)
        q = rand(B, Hq, Sq, D)
        if Hkv == 1 and Hq > 1 and (Sq == 1 or not shape["causal"]):
            # one KV head (MQA, MLA): every query head's rows as rows of one head, the same attention without the
            # Hq-fold expansion of K and V that SDPA's CPU path makes for enable_gqa (MLA's M2 in fp32 would need
            # 18 GB), as a PyTorch user runs MLA's absorbed decode
            q = q.reshape(B, 1, Hq * Sq, D)
        # MLA (latent): V is the first Dv columns of K, as attn reads it (SDPA takes the strided view as it is)
        kv = [(k, k[..., :Dv]) if latent else (k, rand(B, Hkv, Skv, Dv))
              for k in (rand(B, Hkv, Skv, D) for _ in range(sets))]
        kwargs = self.sdpa_kwargs(shape)

        def call(k, v):
            if q.shape[1] == Hkv:  # (heads folded into rows above)
                return F.scaled_dot_product_attention(q, k, v, **{a: b for a, b in kwargs.items() if a != "enable_gqa"})
            if Hq != Hkv and not self.gqa:  # older torch: expand the KV heads (inside the timing)
                k = k.repeat_interleave(Hq // Hkv, dim=1)
                v = v.repeat_interleave(Hq // Hkv, dim=1)
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

        times = []
        with t.inference_mode():
            n = 0
            warm = 0.0
            while True:  # warm-up like attn bench: at least one call, more while under 50 ms in all
                s = time.perf_counter()
                out = call(*kv[n % sets])
                warm += time.perf_counter() - s
                n += 1
                if warm >= 0.05 or n >= 20:
                    break
            if not bool(t.isfinite(out).all()):
                raise RuntimeError("torch produced non-finite output")
            for _ in range(reps):
                s = time.perf_counter()
                call(*kv[n % sets])
                times.append(time.perf_counter() - s)
                n += 1
        return statistics.median(times), sets

    def time_backward(self, shape, reps):
        """Per-call seconds of SDPA's forward and of .backward() on it (fp32, autograd), after one warm-up."""
        t, F = self.torch, self.F
        B, Hq, Hkv, Sq, Skv, D = (shape[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D"))
        gen = t.Generator().manual_seed(1)

        def rand(*size):
            return t.rand(*size, generator=gen, dtype=t.float32) * 2 - 1

        q, k, v = (rand(B, H, S, D).requires_grad_() for H, S in ((Hq, Sq), (Hkv, Skv), (Hkv, Skv)))
        grad = rand(B, Hq, Sq, D)
        kwargs = self.sdpa_kwargs(shape)
        fwd, bwd = [], []
        for rep in range(reps + 1):
            q.grad = k.grad = v.grad = None
            s = time.perf_counter()
            kk, vv = (k, v) if Hq == Hkv or self.gqa else (x.repeat_interleave(Hq // Hkv, dim=1) for x in (k, v))
            out = F.scaled_dot_product_attention(q, kk, vv, **kwargs)
            m = time.perf_counter()
            out.backward(grad)
            e = time.perf_counter()
            if rep:  # the first is the warm-up
                fwd.append(m - s)
                bwd.append(e - m)
        if not all(bool(t.isfinite(x.grad).all()) for x in (q, k, v)):
            raise RuntimeError("torch produced non-finite gradients")
        return fwd, bwd

    def sdpa_kwargs(self, shape):
        """The mask arguments of SDPA for a shape (key padding, causal alignment, GQA)."""
        t = self.torch
        B, Hq, Hkv, Sq, Skv = (shape[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv"))
        kwargs = {}
        if shape["kv_min"]:  # ragged: a padded batch with a key-padding mask (SDPA has no paged path)
            lens = t.tensor([kv_len(shape, b) for b in range(B)])
            kwargs["attn_mask"] = (t.arange(Skv)[None, :] < lens[:, None]).view(B, 1, 1, Skv)
        elif shape["causal"] and Sq == Skv:
            kwargs["is_causal"] = True
        elif shape["causal"]:  # bottom-right: key j allowed for query i when j <= i + Skv - Sq
            i = t.arange(Sq)[:, None]
            j = t.arange(Skv)[None, :]
            kwargs["attn_mask"] = j <= i + (Skv - Sq)
        if Hq != Hkv and self.gqa:
            kwargs["enable_gqa"] = True
        return kwargs


# ---- the canonical shapes --------------------------------------------------------------------------------


def page_bytes(shape, kv_dtype):
    """Bytes of one page of one KV head's K rows as stored (attn bench's scattered-read chunk)."""
    d = shape["D"]
    row = {"f32": 4 * d, "bf16": 2 * d, "f16": 2 * d, "i8": d, "i4": (d + 1) // 2}[kv_dtype]
    return shape["page"] * row


def measure_ceilings(attn, threads, args, page_chunks=()):
    """The machine's ceilings, measured once for the whole run (`attn bench --ceilings-only`: best of 7 trials
    each, the trials and their spread kept), so that every row is judged against the same ones; with them the
    scattered-read ceilings of the paged rows' page sizes (the ceilings' "paged_read", a list)."""
    cmd = [str(attn), "bench", "--json", "--ceilings-only", "--threads", str(threads)] + hp_flag(args)
    if page_chunks:
        cmd += ["--paged-read-chunks", ",".join(str(c) for c in sorted(set(page_chunks)))]
    log("  $ " + " ".join(cmd))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    c = out["ceilings"]
    missing = [k for k in CEILING_KEYS if k not in c]
    if missing:
        raise RuntimeError(f"attn bench --ceilings-only lacks {missing}: {c}")
    c["paged_read"] = out.get("paged_read", [])
    log(f"  ceilings: FMA {c['fma_gflops']:.0f} GFLOP/s (spread {100 * c['fma_spread']:.0f}%), read "
        f"{c['read_gbps']:.1f} GB/s (spread {100 * c['read_spread']:.0f}%)" +
        "".join(f", {r['chunk_bytes']} B pages scattered {r['gbps']:.1f} GB/s" for r in c["paged_read"]))
    return c


def ceiling_values_arg(c):
    args = ["--ceiling-values",
            f"{c['fma_gflops']},{c['amx_bf16_gflops'] or 0},{c['read_gbps']},{c.get('bf16_dot_gflops') or 0}"]
    if c.get("paged_read"):
        args += ["--paged-read-values", ",".join(f"{r['chunk_bytes']}:{r['gbps']}" for r in c["paged_read"])]
    return args


def run_shapes(args, attn, peer, shapes_table, ids, threads):
    rows = []
    chunks = [page_bytes(shapes_table[s], kvd) for _, _, kvd, only in CONFIGS for s in ids
              if (only is None or s in only) and shapes_table[s]["page"]]
    measured = None if args.self_test else measure_ceilings(attn, threads, args, chunks)
    for label, qd, kvd, only in CONFIGS:
        chosen = [s for s in ids if only is None or s in only]
        if not chosen:
            continue
        log(f"{label}: {', '.join(chosen)}")
        common = ["--dtype", qd, "--kv-dtype", kvd, "--threads", threads] + hp_flag(args)
        if args.reps:
            common += ["--reps", args.reps]
        if args.self_test:
            runs = []
            for s in chosen:  # tiny dimensions: one process each, quick ceilings, two K/V sets for decode
                extra = ["--quick-ceilings", "--label", s] + (["--kv-sets", "2"] if s in DECODE else [])
                runs += run_attn(attn, dims_args(shapes_table[s]) + common + extra)
        else:
            runs = run_attn(attn, ["--shape", ",".join(chosen)] + common + ceiling_values_arg(measured))
            for r in runs:  # the values the rows were judged by, with the trials they came from
                r["ceilings"] = dict(measured, given=True)
        for s, r in zip(chosen, runs):
            shape = shapes_table[s]
            if (r["B"], r["Hq"], r["Hkv"], r["Sq"], r["Skv"], r["Dk"]) != tuple(
                    shape[k] for k in ("B", "Hq", "Hkv", "Sq", "Skv", "D")):
                raise RuntimeError(f"attn bench ran {r['label']} with other dimensions than {s}: {r}")
            row = dict(shape=s, config=label, dtype=qd, kv_dtype=kvd, attn=r, torch_s=None, torch_sets=None)
            if peer:
                log(f"  torch SDPA {s} {label}")
                try:
                    row["torch_s"], row["torch_sets"] = peer.time(shape, qd, kvd, r["reps"], s in DECODE)
                except Exception as e:  # e.g. a dtype this torch build has no CPU kernel for
                    row["torch_error"] = f"{type(e).__name__}: {e}"
                    log(f"    torch failed: {row['torch_error']}")
            rows.append(row)
    return rows


def run_ipex(rows, shapes_table, threads, llc):
    """Times Intel Extension for PyTorch on every row (bench/ipex_peer.py in bench/.venv-ipex), in one process
    after attn's and PyTorch's runs; fills ipex_s / ipex_entry (or ipex_error) and returns the versions."""
    py = IPEX_VENV / "bin" / "python"
    todo = [dict(shape=shapes_table[row["shape"]], dtype=row["dtype"], kv_dtype=row["kv_dtype"], reps=row["attn"]["reps"],
                 rotate=row["shape"] in DECODE, llc=llc, threads=threads) for row in rows]
    log(f"Intel Extension for PyTorch ({py}): {len(todo)} rows")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run([str(py), str(BENCH_DIR / "ipex_peer.py")], input=json.dumps(todo), capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        log(f"  IPEX failed: {tail}")
        for row in rows:
            row["ipex_error"] = tail
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for row, r in zip(rows, result["rows"]):
        if "error" in r:
            row["ipex_error"] = r["error"]
        else:
            row["ipex_s"], row["ipex_entry"] = r["seconds"], r["entry"]
    return f"torch {result['torch']}, IPEX {result['ipex']}"


def install_ggml():
    """Fetches llama.cpp's sources (the llama-cpp-python sdist vendors them; PyPI is what this machine reaches) and
    builds bench/ggml_peer against its ggml with -march=native, as a llama.cpp user on this machine would."""
    if GGML_PEER.exists():
        return
    GGML_DIR.mkdir(exist_ok=True)
    log(f"fetching {GGML_PIN} (sdist, PyPI) into {GGML_DIR} and building bench/ggml_peer")
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                           "-d", str(GGML_DIR), GGML_PIN])
    sdist = next(GGML_DIR.glob("llama_cpp_python-*.tar.gz"))
    subprocess.check_call(["tar", "xzf", str(sdist), "-C", str(GGML_DIR)])
    src = next(GGML_DIR.glob("llama_cpp_python-*/vendor/llama.cpp/ggml"))
    subprocess.check_call(["cmake", "-S", str(BENCH_DIR / "ggml_peer"), "-B", str(GGML_DIR / "build"),
                           f"-DGGML_SOURCE_DIR={src}"])
    subprocess.check_call(["cmake", "--build", str(GGML_DIR / "build"), "-j", str(os.cpu_count() or 2),
                           "--target", "ggml_peer"])


def run_ggml(rows, shapes_table, threads, llc):
    """Times llama.cpp's ggml_flash_attn_ext on every row (bench/ggml_peer, one process per row, after attn's and
    PyTorch's runs); fills ggml_s / ggml_kv (or ggml_error) and returns ggml's version."""
    version = None
    log(f"ggml ({GGML_PEER}): {len(rows)} rows")
    for row in rows:
        s = shapes_table[row["shape"]]
        kv = GGML_KV[row["kv_dtype"]]
        row_values = s["D"] + (0 if s.get("latent") else s.get("Dv", s["D"]))
        sets = rotation_sets(s["B"] * s["Hkv"] * s["Skv"] * row_values * GGML_BYTES[kv],
                             llc if row["shape"] in DECODE else 0)
        cmd = [str(GGML_PEER)] + ggml_dims(s) + ["--kv-type", kv, "--threads", str(threads),
                                                 "--reps", str(row["attn"]["reps"]), "--sets", str(sets)]
        log("  $ " + " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            row["ggml_error"] = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            log(f"    ggml failed: {row['ggml_error']}")
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        row["ggml_s"], row["ggml_kv"], row["ggml_sets"] = r["seconds"], kv, r["sets"]
        version = f"ggml {r['ggml']} ({r['ggml_commit']}, from {GGML_PIN})"
    return version


def ggml_dims(s):
    """The row's dimensions for bench/ggml_peer: attn's flags less --paged (ggml has no paged layout: D3 runs a
    padded batch whose keys past each sequence's length are masked, which ggml's kernel skips unread)."""
    return dims_args(dict(s, page=0))


# ---- the backward pass ----------------------------------------------------------------------------------

BACKWARD_SHAPES = ("P1", "P2")  # the goal: >= 1.5x PyTorch's backward on these


def run_backward(args, attn, peer, shapes_table, ids, threads):
    """attn backward (attn bench --backward) and forward, and SDPA forward + .backward(), fp32, in interleaved
    rounds: every round runs each of them `reps` times, so a noisy spell on the shared machine hits all."""
    rounds = 1 if args.self_test else args.rounds
    reps = args.reps or (2 if args.self_test else 3)
    rows = []
    for s in ids:
        shape = shapes_table[s]
        if shape["page"]:
            log(f"backward: {s} skipped (paged K/V; attention_backward takes contiguous K/V)")
            continue
        common = dims_args(shape) + ["--threads", threads, "--reps", reps, "--no-ceilings", "--label", s] + \
            hp_flag(args)
        row = dict(shape=s, attn_bwd=[], attn_fwd=[], torch_bwd=[], torch_fwd=[], flops=None, round_ratios=[])
        for rnd in range(rounds):
            log(f"backward {s}: round {rnd + 1}/{rounds}")
            b = run_attn(attn, common + ["--backward"])[0]
            f = run_attn(attn, common)[0]
            row["attn_bwd"] += b["times_s"]
            row["attn_fwd"] += f["times_s"]
            row["flops"] = b["flops"]
            if peer:
                try:
                    tf, tb = peer.time_backward(shape, reps)
                    row["torch_fwd"] += tf
                    row["torch_bwd"] += tb
                    row["round_ratios"].append(statistics.median(tb) / statistics.median(b["times_s"]))
                except Exception as e:
                    row["torch_error"] = f"{type(e).__name__}: {e}"
                    log(f"    torch failed: {row['torch_error']}")
        rows.append(row)
    return rows


def backward_markdown(rows, threads, torch_version, rounds, reps):
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    out = [f"Backward pass, fp32, {threads} threads for both; {rounds} interleaved round(s) of {reps} runs each "
           f"(attn backward, attn forward, then SDPA forward + .backward()); medians over all runs. "
           f"PyTorch {torch_version or 'not installed'}.", "",
           "| shape | attn backward | PyTorch backward | PyTorch / attn (backward) | per-round ratios | "
           "attn fwd + bwd | PyTorch fwd + bwd | PyTorch / attn (fwd + bwd) | attn backward rate | "
           "PyTorch backward rate |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ab, tb = med(r["attn_bwd"]), med(r["torch_bwd"])
        afb = ab + med(r["attn_fwd"]) if ab else None
        tfb = tb + med(r["torch_fwd"]) if tb else None
        ratio = f"{tb / ab:.2f}×" if tb else ("error" if r.get("torch_error") else "—")
        ratio_fb = f"{tfb / afb:.2f}×" if tfb else "—"
        rounds_text = ", ".join(f"{x:.2f}" for x in r["round_ratios"]) or "—"
        rate = lambda t: f"{r['flops'] / t / 1e9:.1f} GFLOP/s" if t else "—"  # noqa: E731
        out.append(f"| {r['shape']} | {fmt_time(ab)} | {fmt_time(tb)} | {ratio} | {rounds_text} | {fmt_time(afb)} | "
                   f"{fmt_time(tfb)} | {ratio_fb} | {rate(ab)} | {rate(tb)} |")
    out += ["", "- PyTorch backward: the time of `out.backward(grad)` alone, after an untimed-for-it forward "
            "(torch.nn.functional.scaled_dot_product_attention on tensors with requires_grad; GQA via enable_gqa).",
            "- attn backward: `attn bench --backward` (attention_backward from dO and one forward's O and LSE).",
            "- Rates follow FlashAttention's convention: backward flops = 2.5x the forward's "
            "(2·(Dk+Dv)·Hq·allowed pairs), whatever either implementation recomputes.",
            "- Per-round ratios: PyTorch / attn backward medians of each round, a measure of the noise of the "
            "shared machine."]
    return "\n".join(out) + "\n"


# ---- the scaling sweep -----------------------------------------------------------------------------------


def run_scaling(args, attn, peer, threads, ns, ref_max):
    points = []
    for kind in ("prefill", "decode"):
        for n in ns:
            if kind == "prefill":
                shape = dict(SCALING_PREFILL, Sq=n, Skv=n, page=0, kv_min=0)
            else:
                shape = dict(SCALING_DECODE, Skv=n, page=0, kv_min=0)
            base = dims_args(shape) + ["--threads", threads, "--no-ceilings"] + hp_flag(args)
            reps = ["--reps", args.reps] if args.reps else []
            sets = ["--kv-sets", "1"] if args.self_test else []  # the dry run: no GiB of rotated K/V
            flash = run_attn(attn, base + reps + sets + ["--label", f"{kind} N={n}"])[0]
            points.append(dict(kind=kind, N=n, impl="attn flash", time_s=flash["time_median_s"],
                               gflops=flash["gflops"], gbps=flash["gbps"]))
            if kind == "decode" or n <= ref_max:
                # No K/V rotation for the reference: it is timed to show its O(N^2) growth, not bandwidth.
                r = run_attn(attn, base + ["--backend", "reference", "--reps", "1" if args.quick else "3",
                                           "--kv-sets", "1", "--label", f"{kind} N={n} reference"])[0]
                points.append(dict(kind=kind, N=n, impl="attn reference", time_s=r["time_median_s"],
                                   gflops=r["gflops"], gbps=r["gbps"]))
            if peer:
                try:
                    t, _ = peer.time(shape, "f32", "f32", max(3, flash["reps"]), kind == "decode")
                    points.append(dict(kind=kind, N=n, impl="torch SDPA", time_s=t))
                except Exception as e:
                    log(f"    torch failed at {kind} N={n}: {e}")
    return points


def plot_scaling(points, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        log("matplotlib is not installed: no plot (--install-torch installs it into bench/.venv)")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    styles = {"attn flash": "o-", "attn reference": "s--", "torch SDPA": "^-"}
    for ax, kind, guide, title in ((axes[0], "prefill", 2, "prefill: causal, Hq=4, Hkv=1, D=128, Sq=Skv=N"),
                                   (axes[1], "decode", 1, "decode: Sq=1, Hq=32, Hkv=8, D=128, Skv=N")):
        for impl, style in styles.items():
            pts = sorted((p["N"], p["time_s"]) for p in points if p["kind"] == kind and p["impl"] == impl)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl)
        flash = sorted((p["N"], p["time_s"]) for p in points if p["kind"] == kind and p["impl"] == "attn flash")
        if flash:
            n_hi, t_hi = flash[-1]
            ns = [p[0] for p in flash]
            for power, name in ((2, "∝ N²"), (1, "∝ N")):
                ax.plot(ns, [t_hi * (n / n_hi) ** power for n in ns], ":", color="grey" if power == guide else "silver",
                        label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("time per call (s)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---- the report ------------------------------------------------------------------------------------------


def fmt_time(s):
    if s is None:
        return "—"
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


def throughput(r, seconds, paged_note=True):
    """GFLOP/s for compute-bound runs, GB/s for memory-bound ones (attn's useful counts); attn's paged rows also
    against reading their pages scattered (paged_note)."""
    if seconds is None:
        return "—", None
    memory = r["bound"].startswith("memory") or (r["ceilings"] is None and r["Sq"] <= 16)
    c = r["ceilings"]
    if memory:
        rate = r["bytes"] / seconds / 1e9
        # paged rows: also the share of reading their pages scattered (attn bench's paged_read ceiling)
        paged = r.get("paged_read") if paged_note else None
        extra = f" ({100 * rate / paged['gbps']:.0f}% of scattered {paged['chunk_bytes'] // 1024 or paged['chunk_bytes']}" \
                f"{' KiB' if paged['chunk_bytes'] >= 1024 else ' B'} pages)" if paged and paged.get("gbps") else ""
        return f"{rate:.1f} GB/s{extra}", (rate / c["read_gbps"] if c else None)
    rate = r["flops"] / seconds / 1e9
    ceiling = None
    if c:
        ceiling = (c["amx_bf16_gflops"] if r["bound"].startswith("compute (AMX") else
                   c["bf16_dot_gflops"] if r["bound"].startswith("compute (bf16 dot") else c["fma_gflops"])
    return f"{rate:.0f} GFLOP/s", (rate / ceiling if ceiling else None)


def pct(x):
    return "—" if x is None else f"{100 * x:.0f}%"


def markdown(rows, info, threads, torch_version, peer_notes, scaling_png, huge_pages, self_test):
    out = []
    ceil = next((r["attn"]["ceilings"] for r in rows if r["attn"]["ceilings"]), None)
    # Peers timed in processes of their own after attn and PyTorch: a column pair each where they ran.
    peers = [(name, key) for name, key in (("IPEX", "ipex"), ("ggml", "ggml"))
             if any(f"{key}_s" in row or f"{key}_error" in row for row in rows)]
    out.append("| shape | dtype | attn | PyTorch SDPA | PyTorch / attn | " +
               "".join(f"{name} | {name} / attn | " for name, _ in peers) +
               "attn rate | attn % of ceiling | PyTorch rate | PyTorch % of ceiling | attn extra RSS |")
    out.append("|---|---|---|---|---|" + "---|---|" * len(peers) + "---|---|---|---|---|")
    for row in rows:
        r = row["attn"]
        t = row["torch_s"]
        ratio = f"{t / r['time_median_s']:.2f}×" if t else ("error" if row.get("torch_error") else "—")
        a_rate, a_frac = throughput(r, r["time_median_s"])
        p_rate, p_frac = throughput(r, t, paged_note=False)
        extra = r["extra_rss_bytes"] / 2**20
        peer_cols = ""
        for _, key in peers:
            x = row.get(f"{key}_s")
            peer_cols += (f"{fmt_time(x)} | " + (f"{x / r['time_median_s']:.2f}× | " if x else
                                                 ("error | " if row.get(f"{key}_error") else "— | ")))
        out.append(f"| {row['shape']} | {row['config']} | {fmt_time(r['time_median_s'])} | {fmt_time(t)} | {ratio} | "
                   f"{peer_cols}{a_rate} | {pct(a_frac)} | {p_rate} | {pct(p_frac)} | {extra:.1f} MiB |")
    head = ["**Self-test on tiny shapes with quick ceilings: the numbers mean nothing.**"] if self_test else []
    head += [f"Machine: {info.get('cpu') or info.get('brand') or info.get('vendor')}; {threads} threads for both; attn kernel "
            f"{info['active_isa']} (best {info['best_isa']}); PyTorch {torch_version or 'not installed'}."]
    if ceil:
        amx = f"{ceil['amx_bf16_gflops']:.0f} GFLOP/s" if ceil["amx_bf16_gflops"] else f"n/a ({ceil['amx_note']})"
        dot = (f"{ceil['bf16_dot_gflops']:.0f} GFLOP/s" if ceil.get("bf16_dot_gflops")
               else f"n/a ({ceil.get('bf16_dot_note') or 'not measured'})")
        head.append(f"Ceilings measured once for the whole run ({ceil['threads']} threads, best of "
                    f"{len(ceil['read_trials'])} trials; spread (max − min) / max of the trials: FMA "
                    f"{100 * ceil['fma_spread']:.0f}%, read {100 * ceil['read_spread']:.0f}%): "
                    f"fp32 FMA {ceil['fma_gflops']:.0f} GFLOP/s ({ceil['fma_isa']}), AMX bf16 {amx}, bf16 dot product {dot}, "
                    f"streaming read {ceil['read_gbps']:.1f} GB/s ({ceil['read_buffer_bytes'] / 2**20:.0f} MiB buffer).")
    notes = [
        "Times are medians; PyTorch / attn > 1 means attn is faster.",
        "Rates use the same useful work for both: flops = 2·(Dk+Dv)·Hq·(allowed query-key pairs), exact for "
        "causal; bytes = Q, K, V read once and O written. Compute-bound rows show GFLOP/s against the fp32 FMA "
        "peak (for bf16 the peak of the instructions attn's kernel runs: AMX bf16 where the CPU has AMX, the bf16 "
        "dot product where it has AVX512-BF16), memory-bound rows (decode) GB/s against the streaming read "
        "bandwidth.",
        "Decode rows rotate between K/V sets that together exceed twice the last-level cache, so every call "
        "reads K/V from memory (both attn and PyTorch).",
        "D3: attn runs attention_paged (pages of 16 keys scattered over the pool); PyTorch has no paged path "
        "and runs a padded batch (Skv = 8000) with a key-padding mask.",
        "M1–M4 (multi-head latent attention, DeepSeek-V3's absorbed decode: 128 query heads on one latent row of "
        "576 per token, V its first 512 columns): attn and ggml take V as a view into K's rows (the cache is read "
        "once, as llama.cpp runs MLA), PyTorch the same strided view; M3/M4 run attention_paged from pages of 64 "
        "for attn and a contiguous cache for the peers. With 128 heads per cached row they are compute-bound.",
        "\"fp32 Q, fp16 K/V\": attn keeps Q and O in fp32; SDPA needs one dtype, so PyTorch runs all in fp16.",
        "\"bf16 Q, int8 K/V\": attn reads an 8-bit KV cache (a scale per token and head); \"bf16 Q, int4 K/V\": a "
        "4-bit one (a scale per 32 values of a row); PyTorch has no 8- or 4-bit attention and runs bf16 throughout.",
        "attn extra RSS: peak resident memory while running minus the resident memory with the inputs allocated.",
    ] + peer_notes
    if huge_pages:
        notes.append("Inputs of 2 MiB and more sit on transparent huge pages for both (attn bench madvises its "
                     "buffers, PyTorch gets THP_MEM_ALLOC_ENABLE=1), and so does the bandwidth buffer.")
    text = "\n".join(head) + "\n\n" + "\n".join(out) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    if scaling_png:
        text += f"\n![time vs sequence length]({scaling_png})\n"
    return text


def scaling_markdown(points):
    ns = sorted({p["N"] for p in points})
    impls = ["attn flash", "attn reference", "torch SDPA"]
    lines = []
    for kind in ("prefill", "decode"):
        lines.append(f"\n{kind} (time per call)\n")
        lines.append("| N | " + " | ".join(impls) + " |")
        lines.append("|---|" + "---|" * len(impls))
        for n in ns:
            cells = []
            for impl in impls:
                p = next((p for p in points if p["kind"] == kind and p["N"] == n and p["impl"] == impl), None)
                cells.append(fmt_time(p["time_s"]) if p else "—")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---- setup -----------------------------------------------------------------------------------------------


def install_torch(argv):
    """Creates bench/.venv, pip-installs torch and matplotlib from PyPI, and re-runs this script there."""
    py = VENV / "bin" / "python"
    if not py.exists():
        log(f"creating {VENV}")
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    if subprocess.run([str(py), "-c", "import torch, matplotlib"], capture_output=True).returncode != 0:
        log("installing torch and matplotlib into bench/.venv (PyPI; torch's Linux wheels are large)")
        subprocess.check_call([str(py), "-m", "pip", "install", "torch", "matplotlib"])
    rest = [a for a in argv if a != "--install-torch"]
    os.execv(str(py), [str(py), str(Path(__file__).resolve())] + rest)


def default_threads():
    env = os.environ.get("ATTN_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--attn", default=str(REPO / "build" / "attn"), help="the attn program (default: build/attn)")
    ap.add_argument("--shapes", default=",".join(SHAPE_IDS), help="comma-separated shape ids (default: all)")
    ap.add_argument("--threads", type=int, default=default_threads(), help="threads for attn and torch")
    ap.add_argument("--reps", type=int, default=0, help="timed repetitions (default: attn's automatic choice)")
    ap.add_argument("--quick", action="store_true", help="scaling sweep only up to N = 4096")
    ap.add_argument("--max-n", type=int, default=0, help="largest N of the scaling sweep (default 32768)")
    ap.add_argument("--no-scaling", action="store_true", help="skip the scaling sweep")
    ap.add_argument("--scaling-only", action="store_true", help="only the scaling sweep")
    ap.add_argument("--no-torch", action="store_true", help="do not run PyTorch even if it is installed")
    ap.add_argument("--install-torch", action="store_true", help="pip-install torch + matplotlib into bench/.venv")
    ap.add_argument("--install-ipex", action="store_true",
                    help="pip-install Intel Extension for PyTorch (with the torch it pins) into bench/.venv-ipex")
    ap.add_argument("--no-ipex", action="store_true", help="do not run IPEX even if bench/.venv-ipex exists")
    ap.add_argument("--install-ggml", action="store_true",
                    help="fetch llama.cpp's sources (llama-cpp-python sdist, PyPI) and build bench/ggml_peer into "
                         "bench/.ggml")
    ap.add_argument("--no-ggml", action="store_true", help="do not run ggml even if bench/.ggml is built")
    ap.add_argument("--out-dir", default=str(BENCH_DIR), help="where results.md/.json and scaling.png go")
    ap.add_argument("--out", default=None, help="markdown table path (default: OUT_DIR/results.md)")
    ap.add_argument("--no-huge-pages", action="store_true",
                    help="no transparent huge pages for the inputs, neither for attn nor for torch")
    ap.add_argument("--backward", action="store_true",
                    help="only the backward pass: attn vs SDPA + .backward() (fp32) on --shapes (default P1,P2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the --backward comparison")
    ap.add_argument("--cascade", action="store_true",
                    help="only the shared-prefix (cascade) batch decode: attn.attention_paged_cascade against attn's "
                         "plain paged decode of the same batch (attn cascade-bench; B 64, GQA 32/8, d128, a 4096-key "
                         "prefix and 256 own keys each, bf16)")
    ap.add_argument("--self-test", action="store_true",
                    help="dry run on tiny shapes with quick ceilings; checks the JSON and the outputs")
    args = ap.parse_args(argv)
    for option, value, low in (("--threads", args.threads, 1), ("--reps", args.reps, 0), ("--rounds", args.rounds, 1),
                               ("--max-n", args.max_n, 0)):
        if value < low:
            ap.error(f"argument {option}: {value}; expected an integer >= {low}")
    if not [x for x in args.shapes.split(",") if x.strip()]:
        ap.error(f"argument --shapes: '{args.shapes}'; expected one or more shape ids, comma-separated")

    if args.install_ipex and not (IPEX_VENV / "bin" / "python").exists():
        log(f"creating {IPEX_VENV} and installing {' '.join(IPEX_PINS)} (PyPI)")
        subprocess.check_call([sys.executable, "-m", "venv", str(IPEX_VENV)])
        subprocess.check_call([str(IPEX_VENV / "bin" / "python"), "-m", "pip", "install", "-q"] + IPEX_PINS)
    if args.install_ggml:
        install_ggml()
    if args.install_torch:
        install_torch([a for a in argv if a not in ("--install-ipex", "--install-ggml")])
    if not args.no_huge_pages:
        # attn bench asks for transparent huge pages for buffers of 2 MiB and more; PyTorch's CPU allocator
        # does the same when this is set (read when torch loads).
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    torch = None if args.no_torch else import_torch()
    if torch is None and not args.no_torch and not args.self_test and (VENV / "bin" / "python").exists() \
            and Path(sys.prefix).resolve() != VENV.resolve() \
            and not os.environ.get("ATTN_BENCH_REEXEC"):
        # torch lives in bench/.venv: run there. (Compared by sys.prefix: a venv's python is a symlink to the
        # interpreter it was made from, so the two executables resolve to the same file.)
        os.environ["ATTN_BENCH_REEXEC"] = "1"
        py = str(VENV / "bin" / "python")
        os.execv(py, [py, str(Path(__file__).resolve())] + argv)

    attn = Path(args.attn).resolve()
    if not attn.exists():
        log(f"error: {attn} does not exist; build it first (make build) or pass --attn PATH")
        return 2
    load_shapes(attn)
    if args.backward and args.shapes == ",".join(SHAPE_IDS):
        args.shapes = ",".join(BACKWARD_SHAPES)
    ids = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in ids if s not in SHAPES]
    if bad:
        log(f"error: unknown shape(s) {bad}; expected some of {','.join(SHAPES)}")
        return 2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = Path(args.out) if args.out else out_dir / "results.md"
    json_path = md_path.with_suffix(".json")
    png_path = out_dir / "scaling.png"

    info = attn_info(attn)
    threads = args.threads
    # The dry run keeps PyTorch on one K/V set (rotating tiny sets through 2x the LLC would cost a GiB).
    peer = Peer(torch, threads, 0 if args.self_test else info.get("l3_bytes") or 0) if torch else None
    peer_notes = []
    if peer:
        peer_notes.append(f"PyTorch {torch.__version__}: GQA via "
                          f"{'enable_gqa=True' if peer.gqa else 'repeat_interleave of K/V inside the timing'}; "
                          "causal via is_causal when Sq = Skv, else a bottom-right boolean mask.")
    elif not args.no_torch:
        log("torch is not installed: attn only (python3 bench/run_bench.py --install-torch installs it)")

    shapes_table = TINY if args.self_test else SHAPES
    if args.cascade:
        return cascade_main(args, attn, threads, md_path, info)
    if args.backward:
        return backward_main(args, attn, peer, shapes_table, ids, threads, torch, md_path)
    rows = [] if args.scaling_only else run_shapes(args, attn, peer, shapes_table, ids, threads)
    if rows and not args.no_ipex and not args.self_test and (IPEX_VENV / "bin" / "python").exists():
        versions = run_ipex(rows, shapes_table, threads, info.get("l3_bytes") or 0)
        if versions:
            peer_notes.append(f"IPEX ({versions}, its own venv): prefill rows take the faster of "
                              "ipex.llm.functional.varlen_attention and SDPA with IPEX loaded, decode rows "
                              "ipex.llm.modules.PagedAttention.single_query_cached_kv_attention over a paged cache "
                              "(pages of 16, scattered; ragged lengths for D3); IPEX has no 8-bit KV attention, so "
                              "the int8 and int4 rows run in the Q dtype.")
    if rows and not args.no_ggml and not args.self_test and GGML_PEER.exists():
        version = run_ggml(rows, shapes_table, threads, info.get("l3_bytes") or 0)
        if version:
            peer_notes.append(f"{version}, built with -march=native and OpenMP: ggml_flash_attn_ext on the CPU "
                              "backend, in llama.cpp's layout (Q f32; K/V in the cache type llama.cpp's -ctk/-ctv "
                              "would take: f32, bf16, f16, q8_0 for the int8 rows and q4_0 for the int4 rows; an f16 "
                              "mask for causal and "
                              "ragged rows); D3 runs a padded batch whose masked keys ggml skips unread.")

    points = []
    if not args.no_scaling:
        if args.self_test:
            ns, ref_max = [16, 32, 64], 32
        else:
            max_n = args.max_n or (4096 if args.quick else SCALING_N[-1])
            ns, ref_max = [n for n in SCALING_N if n <= max_n], REFERENCE_MAX_N
        points = run_scaling(args, attn, peer, threads, ns, ref_max)
    have_png = bool(points) and plot_scaling(points, png_path)

    text = "# attn vs PyTorch SDPA on the CPU\n\n"
    if rows:
        text += markdown(rows, info, threads, torch.__version__ if torch else None, peer_notes,
                         png_path.name if have_png and png_path.parent == md_path.parent else
                         (str(png_path) if have_png else None), not args.no_huge_pages, args.self_test)
    if points:
        text += "\n## Scaling\n" + scaling_markdown(points)
    md_path.write_text(text)
    json_path.write_text(json.dumps(dict(machine=info, threads=threads, torch=torch.__version__ if torch else None,
                                         rows=rows, scaling=points), indent=1))
    print(text)
    log(f"wrote {md_path}, {json_path}" + (f", {png_path}" if have_png else ""))

    if args.self_test:
        return self_check(rows, points, ids, md_path, json_path, peer, not args.no_scaling)
    return 0


def cascade_main(args, attn, threads, md_path, info):
    """attn cascade-bench (bench/harness/cmd_cascade_bench.cc) in bf16 and f32: the cascade and the plain paged
    decode of the same batch in one process, their outputs compared there; results_cascade.md/.json."""
    size = ["--batch", "4", "--prefix", "64", "--own", "16", "--quick-ceilings"] if args.self_test else []
    rows = []
    for dtype in ("bf16", "f32"):
        cmd = [str(attn), "cascade-bench", "--json", "--threads", str(threads), "--dtype", dtype,
               "--reps", str(args.reps or (2 if args.self_test else 7))] + size
        log("  " + " ".join(cmd[1:]))
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            log(f"error: {' '.join(cmd)} failed: {p.stderr.strip()}")
            return 1
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    r0 = rows[0]
    text = "# attn: shared-prefix (cascade) batch decode against the plain paged decode\n\n"
    if args.self_test:
        text += "**Self-test on tiny shapes with quick ceilings: the numbers mean nothing.**\n\n"
    text += (f"{r0['batch']} sequences, {r0['heads']} query / {r0['kv_heads']} KV heads of {r0['head_dim']}, a "
             f"{r0['prefix']}-key shared prefix and {r0['own']} own keys each, pages of {r0['page']}, "
             f"{threads} threads on {info.get('cpu') or info.get('brand') or 'this CPU'} (best level {info.get('best_isa', '?')}); median of "
             "the timed runs, both in one process on the same inputs (their outputs checked to agree there). The "
             "plain decode reads the prefix once per sequence, the cascade once for the batch; the cascade is "
             "judged against the peak of the instructions its prefix product runs (" +
             ", ".join(sorted({f"{r['dtype']}: {r.get('compute_ceiling', 'AMX bf16 or FMA')}" for r in rows})) +
             ").\n\n")
    text += ("| dtype | plain paged ms | plain GB/s (% of read ceiling) | cascade ms | cascade GFLOP/s (% of ceiling) "
             "| speed-up (plain ms / cascade ms) | its prefix alone ms | its suffix alone ms |\n")
    text += "|---|---:|---:|---:|---:|---:|---:|---:|\n"
    for r in rows:
        text += (f"| {r['dtype']} | {r['plain_ms']:.2f} | {r['plain_gbps']:.1f} ({100 * r['plain_gbps'] / r['read_gbps']:.0f}%) "
                 f"| {r['cascade_ms']:.2f} | {r['cascade_gflops']:.0f} "
                 f"({100 * r['cascade_gflops'] / r['compute_ceiling_gflops']:.0f}%) | {r['speedup']:.2f}x "
                 f"| {r.get('prefix_ms', float('nan')):.2f} | {r.get('suffix_ms', float('nan')):.2f} |\n")
    text += ("\nThe prefix alone is every query of the batch against the shared pages, the suffix alone each sequence "
             "against its own pages, both through attention_paged; the cascade's time less the two is its gather and "
             "merge.\n")
    path = Path(args.out) if args.out else md_path.with_name("results_cascade.md")
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps(dict(threads=threads, rows=rows), indent=1))
    print(text)
    return 0


def backward_main(args, attn, peer, shapes_table, ids, threads, torch, md_path):
    rows = run_backward(args, attn, peer, shapes_table, ids, threads)
    rounds = 1 if args.self_test else args.rounds
    text = "# attn vs PyTorch SDPA on the CPU: the backward pass\n\n"
    if args.self_test:
        text += "**Self-test on tiny shapes: the numbers mean nothing.**\n\n"
    text += backward_markdown(rows, threads, torch.__version__ if torch else None, rounds,
                              args.reps or (2 if args.self_test else 3))
    path = Path(args.out) if args.out else md_path.with_name("results_backward.md")
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps(dict(threads=threads, torch=torch.__version__ if torch else None,
                                                         rows=rows), indent=1))
    print(text)
    log(f"wrote {path}, {path.with_suffix('.json')}")
    if args.self_test:
        bad = [r["shape"] for r in rows if not r["attn_bwd"] or not all(t > 0 for t in r["attn_bwd"])]
        if bad or len(rows) != len([s for s in ids if not shapes_table[s]["page"]]):
            log(f"self-test problem: backward rows {bad or [r['shape'] for r in rows]}")
            return 1
        log(f"self-test ok: backward on {', '.join(r['shape'] for r in rows)}")
    return 0


def self_check(rows, points, ids, md_path, json_path, peer, scaling):
    """The dry run's own assertions: every shape x config ran, the files exist and parse."""
    problems = []
    expected = [(s, c[0]) for c in CONFIGS for s in ids if c[3] is None or s in c[3]]
    got = [(r["shape"], r["config"]) for r in rows]
    if sorted(got) != sorted(expected):
        problems.append(f"rows {got} != expected {expected}")
    for r in rows:
        a = r["attn"]
        if not (a["time_median_s"] > 0 and a["flops"] > 0 and a["bytes"] > 0):
            problems.append(f"{r['shape']}: non-positive time, flops or bytes")
        if a["ceilings"] is None or not a["ceilings"]["fma_gflops"] or not a["ceilings"]["read_gbps"]:
            problems.append(f"{r['shape']}: no ceilings")
        if r["shape"] in DECODE and a["kv_sets"] != 2:
            problems.append(f"{r['shape']}: kv_sets {a['kv_sets']}, expected 2")
        if peer and r["torch_s"] is None and "torch_error" not in r:
            problems.append(f"{r['shape']}: torch did not run")
    if scaling and len({(p["kind"], p["N"]) for p in points if p["impl"] == "attn flash"}) != 6:
        problems.append("scaling: expected 3 prefill and 3 decode points for attn flash")
    data = json.loads(Path(json_path).read_text())
    if len(data["rows"]) != len(rows):
        problems.append("results JSON does not hold every row")
    md = Path(md_path).read_text()
    for s in ids:
        if f"| {s} |" not in md:
            problems.append(f"markdown lacks {s}")
    if problems:
        for p in problems:
            log("self-test problem: " + p)
        return 1
    log(f"self-test ok: {len(rows)} shape/dtype runs, {len(points)} scaling points"
        f"{', torch included' if peer else ', torch not installed (skipped)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
