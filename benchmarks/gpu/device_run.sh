#!/usr/bin/env bash
# The GPU kit on a lent device machine (torch + transformers, no Ray, no network): install the pure-Python
# packages quartet needs that the machine lacks from wheels carried in .whl/, then run every check.
#   .whl/: tensordict, pyvers, jsonschema, referencing, jsonschema-specifications, rpds-py (cp312 wheels)
# Usage there: bash benchmarks/gpu/device_run.sh [seconds] [script]   (results in $OUT, else benchmarks/results/gpu)
#   script: kit (default) or decode_profile
set -u
limit="${1:-420}"
script="${2:-kit}"
out="${OUT:-benchmarks/results/gpu}"
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/quartet-site .whl/*.whl \
    || exit 3
fi
export PYTHONPATH="$PWD/src:/tmp/quartet-site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
name="$script"
[ "$script" = kit ] && name=gpu_kit
timeout "$limit" python3 "benchmarks/gpu/$script.py" --out "$out/$name.json" 2>&1 | tee "$out/$name.log"
