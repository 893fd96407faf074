#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz/corpus/fuzz_npy/ and fuzz/corpus/fuzz_cli_args/ (standard library
only). fuzz/corpus/fuzz_attention_params/ holds inputs kept from fuzzing runs (libFuzzer -merge=1): its
inputs are byte strings read as choices, which nobody writes by hand."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(descr, shape, data, fortran=False, major=1, quote="'"):
    q = quote
    shape_text = "(" + "".join("%d," % d for d in shape) + ")" if len(shape) != 1 else "(%d,)" % shape[0]
    if not shape:
        shape_text = "()"
    header = "{%sdescr%s: %s%s%s, %sfortran_order%s: %s, %sshape%s: %s, }" % (
        q, q, q, descr, q, q, q, "True" if fortran else "False", q, q, shape_text)
    prefix = 10 if major == 1 else 12
    header += " " * ((64 - (prefix + len(header) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H", len(header)) if major == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + length + header.encode() + data


def write(folder, name, data):
    path = os.path.join(HERE, "corpus", folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def npy_seeds():
    f4 = struct.pack("<6f", 1, -2, 0.5, 3, 0, 1e-3)
    seeds = {
        "f32_2x3.npy": npy("<f4", (2, 3), f4),
        "f16_rank4.npy": npy("<f2", (1, 2, 1, 2), struct.pack("<4H", 0x3C00, 0xBC00, 0x3800, 0)),
        "bool_5.npy": npy("|b1", (5,), bytes([1, 0, 2, 0, 1])),
        "i32_empty_0x3.npy": npy("<i4", (0, 3), b""),
        "i64_scalar.npy": npy("<i8", (), struct.pack("<q", -7)),
        "be_i4_fortran_v2.npy": npy(">i4", (2, 3), struct.pack(">6i", 1, 2, 3, 4, 5, 6), fortran=True, major=2),
        "f4_v3_double_quotes.npy": npy("<f4", (2,), struct.pack("<2f", 1, 2), major=3, quote='"'),
        "truncated.npy": npy("<f4", (2, 3), f4)[:-5],
        "trailing.npy": npy("<f4", (2, 3), f4) + b"xyz",
        "float64.npy": npy("<f8", (1,), struct.pack("<d", 1.0)),
        "huge_declared.npy": npy("<f4", (1 << 20, 1 << 20), b"abcd"),
        "header_past_end.npy": b"\x93NUMPY\x01\x00\xff\x7f{'descr': '<f4'",
        "structured.npy": npy("[('a', '<f4')]", (1,), b"abcd").replace(b"'[(", b"[(").replace(b")]'", b")]"),
    }
    for name, data in seeds.items():
        write("fuzz_npy", name, data)


def cli_seeds():
    run = ["run", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"]
    seeds = {
        "run": run,
        "run_all_options": run + ["--lse", "l.npy", "--causal", "bottom-right", "--scale", "0.5", "--mask", "mask.npy",
                                  "--kv-lens", "lens.npy", "--window", "2,1", "--window-align", "top-left",
                                  "--backend", "reference", "--threads", "1"],
        "run_float_mask": run + ["--mask", "maskf.npy", "--kv-lens", "lens64.npy", "--causal", "top-left"],
        "run_backward": run + ["--grad-out", "do.npy", "--dq", "dq.npy", "--dk", "dk.npy", "--dv", "dv.npy"],
        "run_f16": ["run", "--q", "qh.npy", "--k", "kh.npy", "--v", "vh.npy", "--out", "o.npy", "--lse", "l.npy"],
        "run_equals": ["run", "--q=q.npy", "--k=k.npy", "--v=v.npy", "--out=o.npy", "--window=-1,0"],
        "run_out_is_q": run[:8] + ["q.npy"],
        "run_out_hard_link_of_k": run[:8] + ["hard.npy"],
        "run_out_fifo": run[:8] + ["fifo"],
        "run_out_dir": run[:8] + ["sub"],
        "run_out_symlink": run[:8] + ["link.npy"],
        "run_lse_is_out": run + ["--lse", "o.npy"],
        "run_q_fifo": ["run", "--q", "fifo", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
        "run_q_truncated": ["run", "--q", "trunc.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
        "run_k_trailing": ["run", "--q", "q.npy", "--k", "trailing.npy", "--v", "v.npy", "--out", "o.npy"],
        "run_v_float64": ["run", "--q", "q.npy", "--k", "k.npy", "--v", "f8.npy", "--out", "o.npy"],
        "run_mask_nan": run + ["--mask", "nanmask.npy"],
        "run_mask_scalar": run + ["--mask", "scalar.npy"],
        "run_mask_rank5": run + ["--mask", "rank5.npy"],
        "run_lens_bad": run + ["--kv-lens", "lensbad.npy"],
        "run_lens_float": run + ["--kv-lens", "mask1.npy"],
        "run_empty_batch": ["run", "--q", "empty0.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
        "run_bad_values": run + ["--scale", "nan", "--window", "3", "--threads", "9999", "--backend", "gpu"],
        "run_help": ["run", "--help"],
        "explain": ["explain"],
        "explain_files": ["explain", "--q", "q2.npy", "--k", "k3.npy", "--v", "k3.npy", "--causal", "top-left",
                          "--scale", "2"],
        "flops": ["flops", "--seq", "4096", "--d-model", "8192", "--heads", "64", "--kv-heads", "8", "--causal",
                  "--dtype", "f16"],
        "kv_size": ["kv-size", "--layers", "80", "--kv-heads", "64", "--head-dim", "128", "--seq", "64000"],
        "params": ["params", "--d-model", "512", "--heads", "8", "--kv-heads", "2", "--bias"],
        "info": ["info", "--json"],
        "help": ["--help"],
    }
    for name, args in seeds.items():
        write("fuzz_cli_args", name, "\n".join(args).encode())


if __name__ == "__main__":
    npy_seeds()
    cli_seeds()
