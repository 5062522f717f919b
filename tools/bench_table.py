#!/usr/bin/env python3
"""Turn benchmark JSON files (bench_quantize / bench_gemm output) into one markdown table.

usage: tools/bench_table.py [--merge MERGED.json] RESULT.json [RESULT.json ...] > RESULT.md
Every figure is the one the benchmark measured; ratios were taken in the same run.

--merge writes the records of every input into one file of the results format
(bench/results/<date>-<gpu>.json: device, date, commit, records), each record tagged with the
benchmark file it came from, so runs of different days and devices compare by one script.
"""
import json
import sys


def fmt(v, digits=3):
    return "" if v is None else f"{v:.{digits}f}"


def main(paths):
    out = []
    for path in paths:
        d = json.load(open(path))
        out.append(f"## {path.split('/')[-1]}\n")
        out.append(f"device: {d['device']}; date: {d['date']}; commit: {d['commit']}\n")
        if d.get("note"):
            out.append(d["note"] + "\n")
        out.append("| name | kind | ms | value | unit | ratio | ratio_to | extra |")
        out.append("|---|---|---:|---:|---|---:|---|---|")
        for r in d["records"]:
            extra = []
            if r.get("read_once_ratio") is not None:
                extra.append(f"read_once_ratio {r['read_once_ratio']:.3f}")
            if r.get("same_size_copy_ratio") is not None:
                extra.append(f"vs same-size copy {r['same_size_copy_ratio']:.3f}")
            if r.get("speedup_vs_bf16") is not None:
                extra.append(f"vs bf16 {r['speedup_vs_bf16']:.2f}x")
            if r.get("bytes_ratio_to_bf16") is not None:
                extra.append(f"bytes {r['bytes_ratio_to_bf16']:.2f}x bf16's")
            if r.get("floor_ms") is not None:
                extra.append(f"floor {r['floor_ms']:.3f} ms")
            if r.get("ratio_to_torchao") is not None:
                extra.append(f"vs torchao {r['ratio_to_torchao']:.2f}x")
            if r.get("target") is not None:
                extra.append(f"target {r['target']:.2f}x ({r.get('target_what', '')}): "
                             f"gap {r['gap']:+.2f}")
            if r.get("path"):
                extra.append(r["path"])
            if r.get("error"):
                extra.append(f"FAILED: {r['error']}")
            out.append(f"| {r['name']} | {r.get('kind','')} | {fmt(r.get('ms'), 4)} | "
                       f"{fmt(r.get('value'), 1)} | {r.get('unit','')} | {fmt(r.get('ratio'))} | "
                       f"{r.get('ratio_to','')} | {'; '.join(extra)} |")
        out.append("")
    print("\n".join(out))


def merge(out_path, paths):
    files = [json.load(open(p)) for p in paths]
    devices = sorted({d["device"] for d in files})
    if len(devices) != 1:
        raise SystemExit(f"bench_table: inputs come from different devices {devices}")
    merged = {"device": devices[0], "date": files[0]["date"], "commit": files[0]["commit"],
              "sources": [p.split("/")[-1] for p in paths], "records": []}
    for path, d in zip(paths, files):
        for r in d["records"]:
            merged["records"].append({**r, "source": path.split("/")[-1]})
    with open(out_path, "w") as f:
        json.dump(merged, f, indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--merge":
        merge(args[1], args[2:])
        args = args[2:]
    main(args)
