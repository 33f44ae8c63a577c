#!/usr/bin/env bash
# The replay figures on an accelerator, in a few minutes: bench_core's top-k, agreement and
# bookkeeping figures and bench_transformers' training step (bench_megatron's harness runs on
# CPU only). Needs torch with the device, transformers and the rr packages installed (the
# bench session's venv has them). Usage: device_figures.sh [DEVICE (cuda)] [OUT_DIR (.)]
set -euo pipefail
device=${1:-cuda}
out=${2:-.}
python=${PYTHON:-python}
root=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
"$python" "$root/packages/rr-core/benchmarks/bench_core.py" --json --device "$device" \
    > "$out/bench-core-$device.json"
"$python" "$root/packages/rr-transformers/benchmarks/bench_transformers.py" --json \
    --device "$device" --rounds 10 > "$out/bench-transformers-$device.json"
"$python" - "$out" "$device" <<'PY'
import json, sys
out, device = sys.argv[1:]
core = json.load(open(f"{out}/bench-core-{device}.json"))
tf = json.load(open(f"{out}/bench-transformers-{device}.json"))
for key in (
    "replay_topk_over_native",
    "replay_topk_masked_over_native",
    "replay_topk_masked_full_topk_over_native",
    "r3_call_agreement_threshold_over_native",
    "r3_call_agreement_exact_over_native",
):
    print(f"{key:<48} {core[key]:.4g}")
for key in ("step_overhead_ratio_r3", "r3_exact_over_bare", "r3_no_agreement_over_bare"):
    print(f"transformers {key:<35} {tf[key]:.4g}")
PY
