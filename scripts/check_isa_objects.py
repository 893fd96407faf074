#!/usr/bin/env python3
"""The instruction-set units stay in their lane: every function an object of src/cpu/isa_unit.cc.in (or of
src/cpu/flash_amx.cc) defines whose name does not mention its own namespace attn::cpu::<level> must use no AVX
or AVX-512 instruction (no VEX/EVEX mnemonic, no ymm/zmm/mask register). Such a function is an inline or
template function of a header first included inside the unit's `#pragma GCC target` region, which other units
define too; the linker may keep the wide copy for the whole program, and a machine without the instruction set
then dies of an illegal instruction. (A function whose name mentions the namespace, even as a template
argument, exists in this unit only.)

usage: check_isa_objects.py OBJDUMP OBJECT...     (ctest: isa.objects_stay_in_their_namespace)
"""
import os
import re
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
INSN = re.compile(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$")
WIDE_REG = re.compile(r"%(ymm|zmm)\d+|%k[1-7]\b")
# Compiler-generated helpers that live outside any namespace (sanitizer constructors, static initialisers).
GENERATED = ("_GLOBAL__", "asan.", "ubsan.", "__cxx_global", "__sti", "_sub_I_")


def level_of(path):
    base = os.path.basename(path)
    m = re.match(r"isa_([a-z0-9_]+)\.cc\.o$", base)
    if m:
        return m.group(1)
    if base.startswith("flash_amx"):
        return "amx"
    return None


def check(objdump, path):
    level = level_of(path)
    if level is None:
        return []
    own = "attn::cpu::%s::" % level
    out = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", path], check=True, capture_output=True,
                         text=True).stdout
    bad, func, wide = [], None, False
    for line in out.splitlines() + ["0 <end>:"]:
        m = FUNC.match(line)
        if m:
            if func is not None and wide and own not in func and not func.startswith(GENERATED):
                bad.append(func)
            func, wide = m.group(1), False
            continue
        i = INSN.match(line)
        if i and func is not None and (i.group(1).startswith("v") or WIDE_REG.search(i.group(2))):
            wide = True
    return ["%s: %s" % (os.path.basename(path), f) for f in bad]


def main():
    objdump, objects = sys.argv[1], sys.argv[2:]
    checked = [o for o in objects if level_of(o)]
    if not checked:
        print("no instruction-set unit objects given", file=sys.stderr)
        return 1
    bad = [b for o in checked for b in check(objdump, o)]
    if bad:
        print("functions outside their unit's namespace compiled with wide instructions:", file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        return 1
    print("checked %d units: every wide function is in its unit's namespace" % len(checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
