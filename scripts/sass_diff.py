#!/usr/bin/env python3
"""Compares the SASS of the kernels in two sets of object files, function by function.

    python3 scripts/sass_diff.py OLD_DIR NEW_DIR [--cuobjdump PATH] [--show N] [--rename OLD=NEW ...]
                                 [--params OLD_MAP NEW_MAP]

Every *.o under each directory is disassembled (cuobjdump -sass); each kernel's
instructions are normalised (instruction addresses, encodings and blank lines
removed; branch targets stay, they are offsets inside the function) and kernels
are matched by mangled name across all the objects of a side, so that moving a
kernel to another file or folder does not matter (anonymous namespaces, whose
mangled names carry a hash of their file, match by the rest of the name). --rename maps a substring of
old names to its new spelling (a namespace or template argument that changed).
--params names the kernel parameters' constant-bank words, for a change that
moves fields inside the parameter struct: each map file has lines
"OFFSET SIZE NAME [KERNEL]" (byte offset from the first parameter,
c[0x0][0x210] on sm_90; KERNEL: only for kernels whose mangled name contains
it), and c[0x0][X] becomes c[0x0][NAME+DELTA] on each side, so that the same
field read at a new offset compares equal.
Prints, per kernel, identical / different (with the first differing lines) /
only old / only new, and exits 1 when any kernel differs or is missing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

# An anonymous namespace's mangled name carries a hash of its file.
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_\w+?_[0-9a-f]{8}")
ADDR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")
ENCODING = re.compile(r"\s*/\*\s*0x[0-9a-f]{16}\s*\*/\s*$")


def find_cuobjdump(given):
    for c in [given, shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]:
        if c and os.path.exists(c):
            return c
    sys.exit("sass_diff: no cuobjdump (pass --cuobjdump; PyPI: nvidia-cuda-cuobjdump, "
             "with nvidia-cuda-nvdisasm on PATH)")


PARAM_BASE = 0x210
CBANK = re.compile(r"c\[0x0\]\[0x([0-9a-f]+)\]")


def load_params(path):
    fields = []
    for line in open(path):
        parts = line.split()
        if len(parts) in (3, 4):
            fields.append((int(parts[0]), int(parts[1]), parts[2], parts[3] if len(parts) == 4 else ""))
    return fields


def name_params(line, fields, kernel):
    def sub(m):
        at = int(m.group(1), 16) - PARAM_BASE
        for offset, size, name, only in fields:
            if offset <= at < offset + size and only in kernel:
                return f"c[0x0][{name}+{at - offset}]"
        return m.group(0)
    return CBANK.sub(sub, line)


def kernels(directory, cuobjdump, renames, fields=None):
    """{mangled name: [normalised instruction lines]} over every object under directory."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            path = os.path.join(root, f)
            text = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True).stdout
            name, lines = None, []
            for line in text.splitlines():
                m = re.match(r"\s*Function : (\S+)", line)
                if m:
                    if name:
                        out[name] = lines
                    name, lines = ANON.sub("12_GLOBAL__N_1", m.group(1)), []
                    for old, new in renames:
                        name = name.replace(old, new)
                    continue
                if name is None:
                    continue
                if ENCODING.fullmatch(line) or not line.strip():
                    continue
                if line.strip().startswith(".") or "....." in line:
                    continue
                s = ENCODING.sub("", ADDR.sub("", line)).strip()
                if fields:
                    s = name_params(s, fields, name)
                if s:
                    lines.append(s)
            if name:
                out[name] = lines
    return out


def demangle(names):
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
        return dict(zip(names, r.stdout.splitlines()))
    except OSError:
        return {n: n for n in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--show", type=int, default=6, help="differing lines shown per kernel")
    ap.add_argument("--rename", action="append", default=[], help="OLD=NEW substring of old mangled names")
    ap.add_argument("--params", nargs=2, metavar=("OLD_MAP", "NEW_MAP"), help="parameter field maps")
    a = ap.parse_args()
    tool = find_cuobjdump(a.cuobjdump)
    renames = [tuple(r.split("=", 1)) for r in a.rename]
    old_fields = load_params(a.params[0]) if a.params else None
    new_fields = load_params(a.params[1]) if a.params else None
    old, new = kernels(a.old, tool, renames, old_fields), kernels(a.new, tool, [], new_fields)
    names = sorted(set(old) | set(new))
    pretty = demangle(names)
    bad = 0
    for n in names:
        label = pretty.get(n, n)
        if n not in new:
            print(f"only old   {label}")
            bad += 1
        elif n not in old:
            print(f"only new   {label}")
            bad += 1
        elif old[n] == new[n]:
            print(f"identical  {label}  ({len(new[n])} instructions)")
        else:
            bad += 1
            print(f"different  {label}  ({len(old[n])} -> {len(new[n])} instructions)")
            shown = 0
            for i, (x, y) in enumerate(zip(old[n], new[n])):
                if x != y:
                    print(f"    {i}: - {x}\n    {i}: + {y}")
                    shown += 1
                    if shown >= a.show:
                        break
    same = sum(1 for n in names if n in old and n in new and old[n] == new[n])
    print(f"{same} identical, {bad} different or unmatched, of {len(names)} kernels")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
