#!/usr/bin/env bash
# quartet's GPU script on a lent device machine (Python 3.12, torch + transformers, no Ray, no network):
# install the packages quartet needs that the machine lacks from the wheels carried in .whl/
# (benchmarks/gpu/make_wheels.sh makes them here: Ray without its jars, tensordict, pyvers, jsonschema and its
# three dependencies, TRL and its three), then run one script within a time limit.
# Usage there: bash benchmarks/gpu/device_run.sh [seconds] [script]   (results in $OUT, else benchmarks/results/gpu)
#   script: goals (default: issue 37's figures, benchmarks/gpu/goals.py; `goals --only decode,update` runs
#   some of its steps), kit, decode_profile or graph_compile
set -u
start=$SECONDS
limit="${1:-520}"
script="${2:-goals}"
shift $(($# < 2 ? $# : 2))
out="${OUT:-benchmarks/results/gpu}"
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || echo "the wheels did not install: the steps that need them record why they fail"
fi
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -c "import ray, tensordict; print('ray', ray.__version__, 'tensordict', tensordict.__version__)" \
  || echo "ray or tensordict missing: the steps that train through Ray will fail (run make_wheels.sh here)"
left=$((limit - (SECONDS - start)))
if [ "$script" = goals ]; then
  # the script's budget ends 45 s before the limit: a last step stopped at its deadline still writes its record
  timeout "$left" python3 benchmarks/gpu/goals.py --budget $((left - 45)) --out "$out" "$@" 2>&1 | tee "$out/goals.log"
  exit "${PIPESTATUS[0]}"
fi
name="$script"
[ "$script" = kit ] && name=gpu_kit
timeout "$left" python3 "benchmarks/gpu/$script.py" --out "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
