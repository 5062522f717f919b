#!/usr/bin/env bash
# profile_quantize: hardware counters of the quantize kernels that run furthest from the copy
# ceiling in bench_quantize (issue 21's gaps: nvfp4 columnwise / 2-D / Hadamard, blockwise
# both directions, hybrid pairs), read by Nsight Compute.
#
#   bench/profile_quantize.sh BUILD_DIR OUT_DIR [formats] [shape]
#        (defaults: nvfp4,blockwise,hybrid and 8192x8192)
#
# Runs bench_quantize once per option set (--runs 1 --warmup 0) under
#   ncu --clock-control none   (the clocks stay as the machine sets them)
# (the first NCU_LAUNCHES launches, default 400; the benchmark's own copy, fill and spin
# kernels are left out of the table), and writes
#   OUT_DIR/ncu_quantize.csv   one row per kernel launch, the metrics below
#   OUT_DIR/ncu_quantize.md    per kernel name: launches, median duration, DRAM and SM
#                              throughput as % of peak, registers, achieved occupancy,
#                              warp-instructions per byte moved
# Where ncu cannot read the counters (gVisor machines) it says so and exits 3.
set -uo pipefail
build=${1:?usage: profile_quantize.sh BUILD_DIR OUT_DIR [formats] [shape]}
out=${2:?usage: profile_quantize.sh BUILD_DIR OUT_DIR [formats] [shape]}
formats=${3:-nvfp4,blockwise,hybrid}
shape=${4:-8192x8192}
mkdir -p "$out"
bin=$build/bin/bench_quantize
if [[ ! -x $bin ]]; then echo "profile_quantize: no $bin (build first: tools/gpu_check.sh build)"; exit 2; fi
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -z $ncu_bin ]]; then echo "profile_quantize: ncu not found"; exit 3; fi
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
metrics+=,dram__bytes.sum,launch__grid_size,launch__block_size
"$ncu_bin" --clock-control none --csv --print-units base --metrics "$metrics" \
  --launch-count ${NCU_LAUNCHES:-400} \
  "$bin" --runs 1 --warmup 0 --shapes "$shape" --formats "$formats" \
  > "$out/ncu_quantize.raw" 2> "$out/ncu_quantize.err"
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q '"Metric Name"' "$out/ncu_quantize.raw"; then
  echo "profile_quantize: ncu gave no counters (rc $rc):"; tail -5 "$out/ncu_quantize.err"
  exit 3
fi
# ncu prints the program's own output first; the CSV starts at its header line.
sed -n '/"ID","Process ID"/,$p' "$out/ncu_quantize.raw" > "$out/ncu_quantize.csv"
python3 - "$out/ncu_quantize.csv" "$out/ncu_quantize.md" "$shape" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1])))
launches = defaultdict(dict)  # (id, kernel) -> {metric: value}
for r in rows:
    try:
        value = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    launches[(r["ID"], r["Kernel Name"])][r["Metric Name"]] = value
by_kernel = defaultdict(list)
for (_, name), m in launches.items():
    if not any(word in name.lower() for word in ("copy", "fill", "spin", "lead")):
        by_kernel[name].append(m)  # the benchmark's own kernels are left out
def med(ms, key):
    vals = [m[key] for m in ms if key in m]
    return statistics.median(vals) if vals else float("nan")
lines = [f"# Quantize kernels under ncu ({sys.argv[3]}, one launch per option set and usage)",
         "", "| kernel | launches | median us | DRAM % peak | SM % peak | regs | "
         "occupancy % | warp-inst per byte |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
for name, ms in sorted(by_kernel.items(), key=lambda kv: -med(kv[1], "gpu__time_duration.sum")):
    inst, moved = med(ms, "smsp__inst_executed.sum"), med(ms, "dram__bytes.sum")
    lines.append(
        f"| `{name[:110]}` | {len(ms)} | {med(ms, 'gpu__time_duration.sum') / 1e3:.1f} | "
        f"{med(ms, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
        f"{med(ms, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f} | "
        f"{med(ms, 'launch__registers_per_thread'):.0f} | "
        f"{med(ms, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.0f} | "
        f"{inst / moved if moved else float('nan'):.3f} |")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
