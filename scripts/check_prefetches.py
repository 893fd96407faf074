#!/usr/bin/env python3
"""The decode kernels' prefetches are in the code GCC emits. `__builtin_prefetch` has no effect the compiler counts,
so a function (or a walk over rows, inlined or not) whose only effect is prefetching is judged free of effects and
its calls are deleted, every prefetch with them. That happened twice: once to prefetch_rows (decode 25-35 % slower
until it was seen) and once to the 8-bit rows' scales, prefetched by a walk of their own over a tile's rows, which
no build had run since it was written (bench/results_zen4_paged_read.md: a paged 8-bit decode 11 % slower). Nothing
else shows it: the results are the same bits with or without prefetches.

For each kernel unit (isa_<level>.cc.o of src/cpu/isa_unit.cc.in), the functions whose names mention each of these
must hold at least one prefetch instruction:
  StoredTile<signed char>          locating an 8-bit tile's rows prefetches their scales
  StoredTile<attn::core::q4x2>     locating a 4-bit tile's rows prefetches their block scales
  score_keys<                      the score loops prefetch the rows far ahead (prefetch_rows)
  ::accumulate_pv<                 the prefill's P·V steps prefetch the next tile's V rows (NextRows; a lambda that
                                   only prefetched them was deleted whole while it was written). The prefill's score
                                   loop prefetches its K rows from a lambda of scores<>, which has no section of its
                                   own, so it is not checked here.
Only the sections named after such functions are disassembled (GCC gives each template function a section).

usage: check_prefetches.py OBJDUMP OBJECT...     (ctest: isa.decode_prefetches_survive)
"""
import os
import re
import shutil
import subprocess
import sys

UNIT = re.compile(r"isa_([a-z0-9_]+)\.cc\.o$")
NEEDS = ("StoredTile<signed char>", "StoredTile<attn::core::q4x2>", "score_keys<", "::accumulate_pv<")
PREFETCH = re.compile(r"^\s+[0-9a-f]+:\s+prefetch")


def sections_by_name(objdump, path):
    """{demangled function name: section} for the object's code sections named after a function."""
    out = subprocess.run([objdump, "-h", "-w", path], check=True, capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines() if "CODE" in line]
    keyed = [f[1] for f in rows if len(f) > 2 and f[0].isdigit() and "._Z" in f[1]]
    names = subprocess.run([shutil.which("c++filt") or "c++filt"],
                           input="\n".join(s[s.index("._Z") + 1:] for s in keyed),
                           check=True, capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, keyed))


def prefetches(objdump, path, sections):
    count = 0
    for start in range(0, len(sections), 200):  # a command line of bounded length
        args = [objdump, "-d", "--no-show-raw-insn"]
        for section in sections[start:start + 200]:
            args += ["-j", section]
        out = subprocess.run(args + [path], check=True, capture_output=True, text=True).stdout
        count += sum(1 for line in out.splitlines() if PREFETCH.match(line))
    return count


def check(objdump, path):
    level = UNIT.search(os.path.basename(path)).group(1)
    own = "attn::cpu::%s::" % level
    by_name = sections_by_name(objdump, path)
    bad = []
    for need in NEEDS:
        sections = sorted({s for name, s in by_name.items() if need in name and own in name})
        if not sections:
            bad.append("%s: no function mentions %s" % (os.path.basename(path), need))
        elif prefetches(objdump, path, sections) == 0:
            bad.append("%s: no prefetch instruction in the %d functions that mention %s"
                       % (os.path.basename(path), len(sections), need))
    return bad


def main():
    objdump, objects = sys.argv[1], [o for o in sys.argv[2:] if UNIT.search(os.path.basename(o))]
    if not objects:
        print("no kernel unit objects (isa_<level>.cc.o) given", file=sys.stderr)
        return 1
    if shutil.which("c++filt") is None:
        print("c++filt not found: cannot name the sections", file=sys.stderr)
        return 1
    bad = [b for o in objects for b in check(objdump, o)]
    if bad:
        print("decode prefetches the compiler deleted (a walk whose only effect is prefetching is deleted whole):",
              file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        return 1
    print("checked %d kernel units: the tiles' scale prefetches and the score loops' row prefetches are there"
          % len(objects))
    return 0


if __name__ == "__main__":
    sys.exit(main())
