#!/usr/bin/env python3
"""The instruction-set units stay in their lane: every function that an object compiled with a `#pragma GCC target`
region defines, and whose name does not mention the unit's own namespace, must use no AVX or AVX-512 instruction
(no VEX/EVEX mnemonic, no ymm/zmm/mask register). Such a function is an inline or template function of a header
first included inside the unit's target region, which other units define too; the linker may keep the wide copy
for the whole program, and a machine without the instruction set then dies of an illegal instruction. (A function
whose name mentions the namespace, even as a template argument, exists in this unit only.)

And no function outside the unit's namespace may take the unit's vectors or lane type (a `__vector(...)` parameter,
or `VecLanes` among its template arguments: core/variant.h's vector hooks over a kernel's lanes) out of line. Such
a template is defined outside the target region, so GCC compiles it for the baseline wherever it is instantiated:
called out of line from the kernel, it passes AVX vectors through the baseline's ABI and computes garbage (at -O3
every such call is inlined and hides it; at -O2 under the sanitizers it was not). They are always inlined
(ATTN_HD, ATTN_INLINE in core/hd.h).

The objects with a target region, and the namespace each keeps its wide code in:
  isa_<level>.cc.o       src/cpu/isa_unit.cc.in, one per level of src/cpu/isa_list.h   attn::cpu::<level>
  flash_amx.cc.o         src/cpu/flash_amx.cc                                           attn::cpu::amx
  flash_bf16dot.cc.o     src/cpu/flash_bf16dot.cc (cpu/flash_amx.cc again)              attn::cpu::bf16dot
  ceilings_<level>.cc.o  bench/harness/ceilings_unit.cc.in, one per level               attn::tools::ceiling_<level>
The build passes the object libraries that hold them (attn_isa_units, attn_ceiling_units); an object of no known
kind is an error, so a new source with a target region must be added here to be built into one of them.

usage: check_isa_objects.py OBJDUMP OBJECT...     (ctest: isa.objects_stay_in_their_namespace)
"""
import os
import re
import shutil
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
INSN = re.compile(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$")
WIDE_REG = re.compile(r"%(ymm|zmm)\d+|%k[1-7]\b")
# Compiler-generated helpers that live outside any namespace (sanitizer constructors, static initialisers).
GENERATED = ("_GLOBAL__", "asan.", "ubsan.", "__cxx_global", "__sti", "_sub_I_")


# (object file name pattern, the namespace its wide functions must be in; \1 is the level).
KINDS = [
    (re.compile(r"isa_([a-z0-9_]+)\.cc\.o$"), r"attn::cpu::\1::"),
    (re.compile(r"flash_amx\.cc\.o$"), "attn::cpu::amx::"),
    (re.compile(r"flash_bf16dot\.cc\.o$"), "attn::cpu::bf16dot::"),
    (re.compile(r"ceilings_([a-z0-9_]+)\.cc\.o$"), r"attn::tools::ceiling_\1::"),
]


def namespace_of(path):
    """The namespace an object's wide functions must be in, or None for an object of no known kind."""
    base = os.path.basename(path)
    for pattern, namespace in KINDS:
        m = pattern.match(base)
        if m:
            return m.expand(namespace)
    return None


def top_level(name):
    """The name with every <...> and (...) removed: its own scope, return type and qualifiers, no arguments."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def takes_lanes_out_of_line(func, own):
    return own not in top_level(func) and ("__vector(" in func or "VecLanes" in func)


def code_sections(objdump, path):
    """The object's sections of code, by name (`objdump -h`)."""
    out = subprocess.run([objdump, "-h", "-w", path], check=True, capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines() if "CODE" in line]
    return [fields[1] for fields in rows if len(fields) > 2 and fields[0].isdigit()]


def sections_to_read(objdump, path, own):
    """The code sections that may hold a function outside the unit's namespace. GCC gives each inline or template
    function a section of its own (`.text.<mangled name>`): one whose function is in the namespace is left unread
    (disassembling all of a kernel unit took 16 s, 38 s in the sanitizer build; the whole check now takes 4 s where
    it took 45 s, 200 s under the sanitizers); `.text`, `.text.unlikely` and any
    section not named after a function are read whole."""
    sections = code_sections(objdump, path)
    keyed = [s for s in sections if "._Z" in s]
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None or not keyed:
        return sections
    names = subprocess.run([cxxfilt], input="\n".join(s[s.index("._Z") + 1:] for s in keyed), check=True,
                           capture_output=True, text=True).stdout.splitlines()
    if len(names) != len(keyed):
        return sections
    skip = {s for s, name in zip(keyed, names) if own in name}
    return [s for s in sections if s not in skip]


def function_names(nm, path):
    """Every function the object defines (`nm -C`: code symbols, local ones included)."""
    out = subprocess.run([nm, "-C", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        fields = line.split(" ", 2)
        if len(fields) == 3 and fields[1] in ("t", "T", "w", "W", "i"):
            names.append(fields[2])
    return names


def wide_functions(objdump, path, sections):
    """The functions in the given sections that use an AVX or AVX-512 instruction or register."""
    wide_funcs, func, wide = [], None, False
    for start in range(0, len(sections), 200):  # a command line of bounded length
        args = [objdump, "-d", "-C", "--no-show-raw-insn"]
        for section in sections[start:start + 200]:
            args += ["-j", section]
        out = subprocess.run(args + [path], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines() + ["0 <end>:"]:
            m = FUNC.match(line)
            if m:
                if func is not None and wide:
                    wide_funcs.append(func)
                func, wide = m.group(1), False
                continue
            i = INSN.match(line)
            if i and func is not None and (i.group(1).startswith("v") or WIDE_REG.search(i.group(2))):
                wide = True
        func, wide = None, False
    return wide_funcs


def check(objdump, path):
    own = namespace_of(path)
    nm = os.path.join(os.path.dirname(objdump), os.path.basename(objdump).replace("objdump", "nm"))
    if not os.path.exists(nm):
        nm = shutil.which("nm") or "nm"
    bad = [f for f in wide_functions(objdump, path, sections_to_read(objdump, path, own))
           if not f.startswith(GENERATED) and own not in f]
    bad += [f for f in function_names(nm, path) if not f.startswith(GENERATED) and takes_lanes_out_of_line(f, own)]
    return ["%s: %s" % (os.path.basename(path), f) for f in sorted(set(bad))]


def main():
    objdump, objects = sys.argv[1], sys.argv[2:]
    if not objects:
        print("no instruction-set unit objects given", file=sys.stderr)
        return 1
    unknown = [o for o in objects if namespace_of(o) is None]
    if unknown:
        print("objects of no known kind (see the list at the top of this script): " + ", ".join(unknown),
              file=sys.stderr)
        return 1
    bad = [b for o in objects for b in check(objdump, o)]
    if bad:
        print("functions outside their unit's namespace compiled with wide instructions, or taking its vectors out of "
              "line:", file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        return 1
    print("checked %d units: every wide function is in its unit's namespace" % len(objects))
    return 0


if __name__ == "__main__":
    sys.exit(main())
