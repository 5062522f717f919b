#!/usr/bin/env python3
"""Compare the device code of CUDA files between a git revision and the working tree.

  python3 tools/ptx_compare.py --base main [--tree .] [--arch sm_90a] FILE.cu [FILE.cu ...]

Each FILE.cu (a path in the repository, a plugin's or the engine's own under engine/src; files
that exist on one side only are compiled on that side only) is compiled with `nvcc -ptx` and
the plugins' flags (QrecipeCompileFlags.cmake:
-fmad=false --ftz=false --prec-div=true --prec-sqrt=true) at BASE (exported with git archive)
and in the tree. Every function (.entry / .func) is then normalized: its own name, the
anonymous-namespace and file-internal hashes in names, mangled names it refers to (callees,
shared variables) and the function index in branch labels. No GPU is needed; ptxas is not
run, so what is compared is the PTX, which decides the SASS.

Functions are paired by their demangled name with namespaces dropped (so code moved between
files or namespaces pairs up) within the same plugin and the same one-tensor / grouped
family, and classified:
  identical       the normalized PTX is the same
  same ops        not the same text, but the same sequence of memory / barrier / shuffle
                  operations, the same sequence of floating-point operations and the same
                  multiset of all operations (registers erased): register numbering and the
                  order of independent integer instructions differ
  same mem+fp     the memory and floating-point sequences are the same, other instructions
                  differ (branch polarity, predicate forms, ...)
  different       anything else
  base only / tree only   no partner (renamed, removed or new kernels)
The exit status is 0; read the report.
"""
import argparse
import collections
import hashlib
import os
import re
import subprocess
import sys
import tempfile

FLAGS = ["-std=c++20", "-O2", "-DQRECIPE_PLUGIN_HAS_CUDA=1", "-DQRECIPE_PLUGIN_CUDA_VERSION=13000",
         '-DQRECIPE_PLUGIN_CUDA_ARCHS="90a"', "-fmad=false", "--ftz=false", "--prec-div=true",
         "--prec-sqrt=true"]
INTERNAL = re.compile(r"\d+_INTERNAL_[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}")
ANON = re.compile(r"\d+_GLOBAL__N__[0-9A-Za-z_]+?_[0-9a-f]{8}|_NV_ANON_NAMESPACE")
MEMORY = re.compile(r"(ld|st|atom|red|shfl|bar|cp\.async|vote|membar|fence)\.")
FLOAT = re.compile(r"(add|sub|mul|fma|div|rcp|min|max|abs|neg|setp)\.(\w+\.)*(f32|f16|bf16|f64)\b"
                   r"|cvt\.\w+\.(f32|f16|bf16)\b|cvt\.(\w+\.)*(f32|f16|bf16)\.")


def compile_ptx(root, path, arch, out):
    cmd = ["nvcc", "-ptx", "-arch=" + arch, "-I", os.path.join(root, "engine/include"),
           "-I", os.path.join(root, "engine/src")] + FLAGS  # engine/src: the engine's own .cu
    subprocess.run(cmd + ["-o", out, os.path.join(root, path)], check=True)
    return open(out).read()


def functions(ptx, family):
    """(raw name, normalized body) of every function defined in a PTX module."""
    for chunk in re.split(r"\n(?=(?:\.visible |\.weak )?\.(?:entry|func)\b)", ptx)[1:]:
        head = chunk.split("{", 1)[0]
        if "{" not in chunk or head.rstrip().endswith(";"):
            continue  # a prototype
        name = re.search(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", head).group(1)
        end = chunk.find("\n}\n")
        body = chunk[:end + 2] if end >= 0 else chunk
        body = body.replace(name, "FN").replace(name[2:], "FN")
        body = ANON.sub("ANON", INTERNAL.sub("INTERNAL", body))
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
        body = re.sub(r"\b_Z\w+", "MANGLED", body)
        lines = [l.strip() for l in body.split("\n") if l.strip() and not l.strip().startswith("//")]
        yield name, family, lines


def demangled_keys(entries):
    names = [ANON.sub("4ANON", INTERNAL.sub("8INTERNAL", n)) for n, _, _ in entries]
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    keys = []
    for (n, family, _), d in zip(entries, out.stdout.split("\n")):
        k = re.sub(r"\b(qrecipe|sdk|cuda|blockwise|mxfp8|float8|nvfp4|hybrid|INTERNAL|ANON)::",
                   "", d)
        k = re.sub(r"\(anonymous namespace\)::", "", k)
        k = re.sub(r"\b\w+::(?=[A-Z]\w*\b)", "", k)  # Type::Nested -> Nested (moved types)
        keys.append(family + " " + k)
    return keys


def classify(a, b):
    if a == b:
        return "identical"
    erase = lambda l: re.sub(r"%\w+", "%", re.sub(r"\$L__BB_\d+", "L", l))
    body = lambda ls: [l for l in ls[1:] if not l.startswith(".reg")]
    ea, eb = [erase(l) for l in body(a)], [erase(l) for l in body(b)]
    mem = lambda ls: [l for l in ls if MEMORY.match(l) and not l.startswith("ld.param")]
    fp = lambda ls: [l for l in ls if FLOAT.match(l)]
    if mem(ea) != mem(eb) or fp(ea) != fp(eb):
        return "different"
    return "same ops" if sorted(ea) == sorted(eb) else "same mem+fp"


def family_of(path):
    base = os.path.basename(path)
    return base.split("_")[0] + ("/grouped" if "grouped" in base else "/one")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--tree", default=".", help="the checkout to compare (default .)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    with tempfile.TemporaryDirectory(prefix="ptx_compare.") as tmp:
        base_root = os.path.join(tmp, "base")
        os.makedirs(base_root)
        archive = subprocess.run(["git", "-C", tree, "archive", args.base, "engine/include",
                                  "engine/src", "plugins"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base_root], input=archive, check=True)
        sides = {}
        for side, root in (("base", base_root), ("tree", tree)):
            entries = []
            for f in args.files:
                if not os.path.exists(os.path.join(root, f)):
                    continue
                print(f"{side}: nvcc -ptx {f}", file=sys.stderr)
                ptx = compile_ptx(root, f, args.arch, os.path.join(tmp, side + "_" +
                                                                  os.path.basename(f) + ".ptx"))
                entries += list(functions(ptx, family_of(f)))
            sides[side] = dict(zip(demangled_keys(entries), (e[2] for e in entries)))
    base, new = sides["base"], sides["tree"]
    report = collections.defaultdict(list)
    for k in sorted(set(base) | set(new)):
        if k not in new:
            report["base only"].append(k)
        elif k not in base:
            report["tree only"].append(k)
        else:
            report[classify(base[k], new[k])].append(k)
    for verdict in ("identical", "same ops", "same mem+fp", "different", "base only",
                    "tree only"):
        keys = report.get(verdict, [])
        print(f"{verdict}: {len(keys)}")
        if verdict != "identical":
            for k in keys:
                print("    " + k[:200])


if __name__ == "__main__":
    main()
