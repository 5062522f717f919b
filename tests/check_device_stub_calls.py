#!/usr/bin/env python3
"""No host code reaches the host stub of a __device__-only function.

nvcc gives every __device__ function with external linkage a host-side body that calls
exit(1). Host code inside a template may call a __device__-only function without any
diagnostic; it then runs that stub and the process exits with status 1 and no message. That
is how the block-scaled grouped GEMM stopped its callers (its launcher sized a launch with a
__device__ helper). This check reads the disassembly of each library (objdump -d) and fails
when:
  - a function that calls exit/_exit/_Exit does anything else (a stub inlined into host
    code: the stub's own body is the exit call alone), or
  - any instruction calls or jumps to such a function (a host path into a stub).
No library qrecipe builds calls exit on purpose; the CLI is an executable and is not checked.

    check_device_stub_calls.py LIB_OR_DIR...   (a directory: its *.so files)

Exit status: 0 clean, 1 with every offender listed, 2 on bad usage or a missing objdump.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

FUNCTION = re.compile(r"^([0-9a-f]+) <(.+)>:$")
CALL = re.compile(r"^\s*([0-9a-f]+):\s+(call|jmp|j[a-z]+)\s+([0-9a-f]+) <(.+)>\s*$")
EXITS = {"exit@plt", "_exit@plt", "_Exit@plt"}


def libraries(paths: list[str]) -> list[pathlib.Path]:
    found = []
    for arg in paths:
        p = pathlib.Path(arg)
        if p.is_dir():
            found += sorted(p.glob("*.so"))
        elif p.is_file():
            found.append(p)
        else:
            raise SystemExit(f"check_device_stub_calls.py: {arg} is neither a library nor a directory")
    return found


def offenders(lib: pathlib.Path) -> list[str]:
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(lib)], check=True,
                          capture_output=True, text=True).stdout
    # Per function: its address, name, and the calls/jumps it makes (target address, name).
    functions: dict[int, tuple[str, list[tuple[int, str, str]]]] = {}
    current = None
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = int(m.group(1), 16)
            functions[current] = (m.group(2), [])
            continue
        c = CALL.match(line)
        if c and current is not None:
            functions[current][1].append((int(c.group(3), 16), c.group(2), c.group(4)))
    stubs = {addr for addr, (_, calls) in functions.items()
             if any(name in EXITS for _, _, name in calls)}
    found = []
    for addr in stubs:
        name, calls = functions[addr]
        others = [n for _, op, n in calls if op == "call" and n not in EXITS]
        if others:
            found.append(f"{lib.name}: {name[:160]} calls exit and also {others[0][:80]}: a __device__ "
                         "function's host stub inlined into host code")
    # A call through the PLT (an exported stub, position-independent code) names its target.
    stub_names = {functions[a][0] for a in stubs}
    for addr, (name, calls) in functions.items():
        for target, op, target_name in calls:
            if target_name.endswith("@plt") and target_name[:-4] in stub_names:
                target = next(a for a in stubs if functions[a][0] == target_name[:-4])
            if target in stubs and target != addr:
                found.append(f"{lib.name}: {name[:160]} {op}s {functions[target][0][:120]}, whose host "
                             "body is nvcc's exit(1) stub: a host call of a __device__-only function")
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: check_device_stub_calls.py LIB_OR_DIR...", file=sys.stderr)
        return 2
    if shutil.which("objdump") is None:
        print("check_device_stub_calls.py: objdump not found (binutils)", file=sys.stderr)
        return 2
    libs = libraries(argv[1:])
    if not libs:
        print("check_device_stub_calls.py: no libraries found in " + " ".join(argv[1:]), file=sys.stderr)
        return 2
    problems = [p for lib in libs for p in offenders(lib)]
    for p in problems:
        print(p)
    print(f"{len(libs)} libraries, {len(problems)} host paths into __device__ stubs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
