#!/usr/bin/env bash
# The newcomer walk-through: a fresh clone of this repository, the README's commands in order, each
# timed, the output in one log. Run it on a quiet machine before changing the README's times:
#   tools/newcomer_walkthrough.sh /tmp/walk > /tmp/walk.log 2>&1
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:?usage: tools/newcomer_walkthrough.sh SCRATCH_DIR}"
rm -rf "$WORK/clone" && mkdir -p "$WORK" && git clone -q "$REPO" "$WORK/clone" && cd "$WORK/clone" || exit 1
step() {
  echo "=== \$ $*"
  local began=$SECONDS
  bash -c "$*" 2>&1
  echo "=== rc $?, $((SECONDS - began)) s"
}
step make demo
step '. .venv/bin/activate && quartet demo --quick'
step '. .venv/bin/activate && quartet train examples/grpo_arithmetic/config.yaml'
step '. .venv/bin/activate && quartet train examples/grpo_arithmetic/config.yaml'  # a rerun: nothing left
step '. .venv/bin/activate && quartet plot runs/quartet/grpo-arithmetic'
step '. .venv/bin/activate && quartet plan examples/single_cpu/config.yaml'
step '. .venv/bin/activate && quartet config show --doc | head -5'
step '. .venv/bin/activate && quartet train'
step '. .venv/bin/activate && quartet plan examples/single_gpu/config.yaml'
step '. .venv/bin/activate && quartet demo --task vision --quick'
