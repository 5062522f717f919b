#!/usr/bin/env python3
"""Every shipped recipe (recipes/*.yaml) opens with a comment header that says what it is for
and where each GEMM runs natively, and its Hopper column says what the engine plans.

    python3 tests/check_recipe_headers.py REPO_ROOT QRECIPE_CLI   (ctest: recipe_headers)
    python3 tests/check_recipe_headers.py --self-test             (recipe_headers_self_test)

A header is the comment block before the first YAML line. It must hold:
  - at least one line of prose before the table (what the recipe is for);
  - the table: a line `GEMM  operands  Hopper (sm_90, qrecipe)  Blackwell (sm_100)`, then one
    line each for fprop, dgrad and wgrad, in that order, whose Hopper cell (the text under
    "Hopper") starts with native, emulated or dense and whose Blackwell cell is not empty.
The Hopper cell's first word must then agree with `QRECIPE_CLI recipe explain RECIPE --device
sm90 --module linear:fc:256:256` (dense = "high precision"): a header that drifts from the
pairing table fails here, naming the recipe, the line, the GEMM and both words.

Exit status 0 when every header is complete and agrees, 1 with the list of problems, 2 for
bad usage.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

GEMMS = ("fprop", "dgrad", "wgrad")
TABLE_HEAD = re.compile(r"^#\s+GEMM\s+operands\s+(Hopper \(sm_90, qrecipe\))\s+(Blackwell \(sm_100\))")
# What explain prints after "->" for each GEMM, as the header's first word says it.
EXPLAIN_WORD = {"native": "native", "emulated": "emulated", "high precision": "dense"}
EXPLAIN_LINE = re.compile(r"^\s+(fprop|dgrad|wgrad) \[[0-9x]+\]: .* -> (native|emulated|high precision)\b")
# A linear layer whose dimensions the GPU multiplies natively (multiples of 16): the shape the
# headers describe. The name matches no rule of float8_bf16_ends.yaml's by-name overrides.
EXPLAIN_MODULE = "linear:fc:256:256"


def header_lines(text: str) -> List[Tuple[int, str]]:
    """(line number, line) of the comment block before the first YAML line."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#"):
            break
        out.append((number, line))
    return out


def parse_header(rel: str, text: str) -> Tuple[Dict[str, Tuple[int, str]], List[str]]:
    """The Hopper column's first word per GEMM (with its line number), and the problems."""
    lines = header_lines(text)
    problems: List[str] = []
    if not lines:
        return {}, [f"{rel}:1: no comment header (say what the recipe is for and where each "
                    f"GEMM runs natively on Hopper and Blackwell; see recipes/default.yaml)"]
    table_at = next((i for i, (_, line) in enumerate(lines) if TABLE_HEAD.match(line)), None)
    if table_at is None:
        return {}, [f"{rel}:{lines[0][0]}: the header has no 'GEMM  operands  Hopper (sm_90, "
                    f"qrecipe)  Blackwell (sm_100)' table (see recipes/default.yaml)"]
    if not any(line.strip("# ").strip() for _, line in lines[:table_at]):
        problems.append(f"{rel}:{lines[0][0]}: no prose before the table: say what the recipe "
                        f"is for")
    head = TABLE_HEAD.match(lines[table_at][1])
    hopper_col, blackwell_col = head.start(1), head.start(2)
    hopper: Dict[str, Tuple[int, str]] = {}
    rows = lines[table_at + 1:table_at + 1 + len(GEMMS)]
    for gemm, (number, line) in zip(GEMMS, rows + [(lines[-1][0], "")] * len(GEMMS)):
        if not re.match(rf"^#\s+{gemm}\s", line):
            problems.append(f"{rel}:{number}: expected the table's '{gemm}' row here, got "
                            f"{line.strip() or 'the end of the header'!r}")
            continue
        cell = line[hopper_col:blackwell_col].strip()
        word = cell.split(" ", 1)[0] if cell else ""
        if word not in ("native", "emulated", "dense"):
            problems.append(f"{rel}:{number}: the {gemm} row's Hopper cell {cell!r} does not "
                            f"start with native, emulated or dense (is it under the "
                            f"'Hopper' heading?)")
            continue
        if not line[blackwell_col:].strip():
            problems.append(f"{rel}:{number}: the {gemm} row has no Blackwell cell")
        hopper[gemm] = (number, word)
    return hopper, problems


def parse_explain(output: str) -> Dict[str, str]:
    """The header word for each GEMM that explain's output plans."""
    found = {}
    for line in output.splitlines():
        m = EXPLAIN_LINE.match(line)
        if m:
            found[m.group(1)] = EXPLAIN_WORD[m.group(2)]
    return found


def compare(rel: str, hopper: Dict[str, Tuple[int, str]], planned: Dict[str, str],
            command: str) -> List[str]:
    problems = []
    for gemm, (number, word) in hopper.items():
        if gemm not in planned:
            problems.append(f"{rel}:{number}: `{command}` printed no {gemm} line")
        elif planned[gemm] != word:
            problems.append(f"{rel}:{number}: the header says {gemm} runs '{word}' on Hopper, "
                            f"but `{command}` plans '{planned[gemm]}': update the header (or "
                            f"the pairing table, if the header is right)")
    return problems


def check(root: Path, cli: str) -> List[str]:
    recipes = sorted((root / "recipes").glob("*.yaml"))
    if not recipes:
        return [f"no recipes/*.yaml under {root}"]
    problems: List[str] = []
    for path in recipes:
        rel = path.relative_to(root).as_posix()
        hopper, found = parse_header(rel, path.read_text(encoding="utf-8"))
        problems += found
        if not hopper:
            continue
        args = [cli, "recipe", "explain", str(path), "--device", "sm90", "--module",
                EXPLAIN_MODULE]
        command = f"qrecipe recipe explain {rel} --device sm90 --module {EXPLAIN_MODULE}"
        run = subprocess.run(args, capture_output=True, text=True)
        if run.returncode != 0:
            problems.append(f"{rel}: `{command}` failed (exit {run.returncode}): "
                            f"{(run.stderr or run.stdout).strip()}")
            continue
        problems += compare(rel, hopper, parse_explain(run.stdout), command)
    return problems


def self_test() -> int:
    """Good and bad headers and explain outputs: exactly the planted problems are found."""
    good = ("# What it is for.\n#\n"
            "#   GEMM   operands          Hopper (sm_90, qrecipe)          Blackwell (sm_100)\n"
            "#   fprop  x  row . W row    native FP8 E4M3 x E4M3           native FP8\n"
            "#   dgrad  dy row . W col    emulated (no MXFP8)              native MXFP8\n"
            "#   wgrad  dy col . x col    dense                            dense\n"
            "version: 1\n")
    explain = ("linear fc [256 -> 256]:\n"
               "  fprop [2048x256x256]: e4m3 x e4m3 -> native (cuBLASLt FP8)\n"
               "  dgrad [2048x256x256]: e5m2 x e4m3 1x32 blocks -> emulated (an operand ...)\n"
               "  wgrad [256x256x2048]: bf16 x bf16 -> high precision (both unquantized)\n")
    cases = {
        "good": (good, explain, []),
        "no header": ("version: 1\n", explain, ["no comment header"]),
        "no table": ("# For FP8.\nversion: 1\n", explain, ["has no 'GEMM"]),
        "no prose": (good.replace("# What it is for.\n#\n", ""), explain, ["no prose"]),
        "rows out of order": (good.replace("#   dgrad", "#   xgrad"), explain,
                              ["expected the table's 'dgrad' row"]),
        "missing row": (good.replace("#   wgrad  dy col . x col    dense"
                                     "                            dense\n", ""), explain,
                        ["expected the table's 'wgrad' row"]),
        "bad word": (good.replace("native FP8 E4M3 x E4M3 ", "fast   FP8 E4M3 x E4M3 "),
                     explain, ["Hopper cell 'fast"]),
        "no Blackwell cell": (good.replace("native MXFP8", "            "), explain,
                              ["dgrad row has no Blackwell cell"]),
        "drifted": (good, explain.replace("-> emulated", "-> native"),
                    ["says dgrad runs 'emulated' on Hopper, but `cmd` plans 'native'"]),
        "explain silent": (good, explain.replace("  wgrad", "  other"),
                           ["printed no wgrad line"]),
    }
    failures = []
    for name, (text, output, expected) in cases.items():
        hopper, problems = parse_header("r.yaml", text)
        if hopper:
            problems += compare("r.yaml", hopper, parse_explain(output), "cmd")
        missed = [e for e in expected if not any(e in p for p in problems)]
        if missed or len(problems) != len(expected):
            failures.append(f"{name}: expected {expected}, got {problems}")
    if failures:
        print("self-test FAILED\n  " + "\n  ".join(failures))
        return 1
    print(f"self-test: ok ({len(cases)} cases, each planted problem found, nothing else)")
    return 0


def main(argv: List[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root, cli = Path(argv[1]).resolve(), argv[2]
    if not (root / "recipes").is_dir():
        print(f"check_recipe_headers.py: {root} has no recipes/ folder (give the qrecipe "
              f"repository root)", file=sys.stderr)
        return 2
    problems = check(root, cli)
    if problems:
        print(f"{len(problems)} problem(s) in the shipped recipes' headers:")
        print("\n".join("  " + p for p in problems))
        return 1
    print(f"recipe headers: ok ({len(list((root / 'recipes').glob('*.yaml')))} recipes, "
          f"Hopper column as `qrecipe recipe explain --device sm90` plans)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
