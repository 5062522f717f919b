#!/usr/bin/env python3
"""Compare two bench_quantize (or bench_gemm) JSON files of the SAME machine and run, record by
record: the time of the candidate over the time of the base (below 1: the candidate is faster).

usage: tools/bench_compare.py BASE.json CANDIDATE.json [--noise 0.05] [--out COMPARE.json] > COMPARE.md

Records are matched by name; a name present in one file only is listed as such, never
dropped. The verdict of a record is "regression" when candidate/base exceeds 1 + noise,
"faster" below 1 - noise, "same" otherwise. Run both binaries interleaved on one GPU in one
session: times of different sessions or devices are not comparable.
"""
import argparse
import json
import sys


def records_by_name(path):
    data = json.load(open(path))
    by_name = {}
    for r in data["records"]:
        if r.get("ms") is None:
            continue
        if r["name"] in by_name:
            raise SystemExit(f"{path}: record name {r['name']!r} occurs twice; names must be unique to compare")
        by_name[r["name"]] = r
    return data, by_name


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base")
    p.add_argument("candidate")
    p.add_argument("--noise", type=float, default=0.05, help="relative band counted as noise (default 0.05)")
    p.add_argument("--out", help="also write the comparison as JSON")
    a = p.parse_args(argv)
    base_data, base = records_by_name(a.base)
    cand_data, cand = records_by_name(a.candidate)
    if base_data.get("device") != cand_data.get("device"):
        raise SystemExit(f"devices differ ({base_data.get('device')!r} vs {cand_data.get('device')!r}): "
                         "compare runs of one machine only")
    rows = []
    for name in sorted(set(base) | set(cand)):
        b, c = base.get(name), cand.get(name)
        if b is None or c is None:
            rows.append({"name": name, "verdict": "only in " + ("candidate" if b is None else "base")})
            continue
        ratio = c["ms"] / b["ms"] if b["ms"] > 0 else float("inf")
        verdict = "regression" if ratio > 1 + a.noise else "faster" if ratio < 1 - a.noise else "same"
        rows.append({"name": name, "base_ms": b["ms"], "candidate_ms": c["ms"], "ratio": ratio, "verdict": verdict})
    counts = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print(f"device: {cand_data.get('device')}; base {base_data.get('commit')} vs candidate {cand_data.get('commit')}; "
          f"noise band {a.noise:.0%}\n")
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + "\n")
    print("| name | base ms | candidate ms | candidate / base | verdict |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        if "ratio" in r:
            print(f"| {r['name']} | {r['base_ms']:.4f} | {r['candidate_ms']:.4f} | {r['ratio']:.3f} | {r['verdict']} |")
        else:
            print(f"| {r['name']} | | | | {r['verdict']} |")
    if a.out:
        json.dump({"device": cand_data.get("device"), "base_commit": base_data.get("commit"),
                   "candidate_commit": cand_data.get("commit"), "noise": a.noise, "counts": counts, "rows": rows},
                  open(a.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
