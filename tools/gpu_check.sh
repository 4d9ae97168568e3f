#!/usr/bin/env bash
# The GPU checks of issue 23, in one call on a lent GPU machine (the `device` tool's `run`). Every log
# and JSON lands under $OUT (they come back); each stage has its own time limit, so a slow one leaves
# the others' results. Set-up first, as ../shared/gpu/README.md says (pack here, three `run` calls);
# that machine has no pytest, so its wheels go into the small pack too:
#   here, once:  bash ../shared/gpu/pack.sh && python3 -m pip download -q --no-deps --only-binary=:all: \
#                  --python-version 3.12 -d .gpu/small pytest pluggy iniconfig packaging pygments
#   run 1: carry [".gpu/small", ".gpu/w1", ".gpu/unpack.sh"]  command: bash .gpu/unpack.sh
#   run 2: carry [".gpu/w2", ".gpu/w3", ".gpu/unpack.sh"]     command: bash .gpu/unpack.sh
#   run 3: carry [".gpu/w4", ".gpu/unpack.sh"]                command: bash .gpu/unpack.sh && bash tools/gpu_check.sh
# (later calls on the same warm machine: carry [".gpu/unpack.sh"], command
#  `QF_REINSTALL=1 bash .gpu/unpack.sh && bash tools/gpu_check.sh`).
#
# Stages (cumulative wall time on one H100, first call: MuJoCo Warp's kernels compile cold, ~4-5 min):
#   1. the GPU test lane: pytest -m gpu over every test module that has gpu-marked tests (the stream
#      fix, Warp-on-CUDA equivalence with mujoco_cpu flat and rough, the gait expert under both
#      backends; the trainers on CUDA)
#   2. quadforge bench scale --quick: env and backend-only steps/s, env/backend, buffers and memory
#      per world at 4096 worlds (Go1, mixed terrain)
#   3. GPU_CHECK_FULL=1 only: the full sweep (4096 / 16384 / 32768 worlds and a cold compile)
# Limits per stage (seconds): GPU_CHECK_TEST_S (default 400: a cold kernel compile is most of it),
# GPU_CHECK_BENCH_S (160), GPU_CHECK_FULL_S (500, a later call: kernels cached on the warm machine).
# Stages 1 and 2 fit one `run` of timeout_s 600.
set -uo pipefail
proj=$(pwd)
out=${OUT:-/tmp/gpu_check_out}
mkdir -p "$out"
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/qf/proj-site:/tmp/qf/site${PYTHONPATH:+:$PYTHONPATH}
log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }

{ nvidia-smi; python3 -c "import torch, warp, mujoco_warp; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0)); print('warp', warp.__version__, 'mujoco_warp', getattr(mujoco_warp, '__version__', '?'))"; \
  git -C "$proj" log --oneline -1 2>/dev/null || true; } > "$out/env.txt" 2>&1
log "machine: $(grep -m1 -o 'NVIDIA [A-Z0-9 ]*' "$out/env.txt" || echo unknown)"

# cd away from the project root: its quadforge/ folder would shadow the installed package
cd /tmp
log "stage 1: pytest -m gpu"
python3 -c "import pytest" 2>/dev/null || log "pytest is not installed here: add its wheels to .gpu/small (header)"
# every module holding gpu-marked tests (collecting the whole tree would import packages this machine lacks)
gpu_tests=$(grep -rl "mark.gpu" "$proj/tests" --include="test_*.py" | sort)
timeout "${GPU_CHECK_TEST_S:-400}" python3 -m pytest $gpu_tests -m gpu -v -rs \
  -p no:cacheprovider --rootdir="$proj" -c "$proj/pyproject.toml" > "$out/pytest_gpu.txt" 2>&1
log "stage 1 exit $? ($(tail -1 "$out/pytest_gpu.txt"))"

log "stage 2: bench scale --quick"
timeout "${GPU_CHECK_BENCH_S:-160}" python3 -m quadforge.tools.cli bench scale --quick \
  --json "$out/scale_quick.json" > "$out/scale_quick.txt" 2>&1
log "stage 2 exit $? ($(grep -m1 'GPU targets' "$out/scale_quick.txt" || tail -1 "$out/scale_quick.txt"))"

if [ -n "${GPU_CHECK_FULL:-}" ]; then
  log "stage 3: bench scale (full sweep)"
  timeout "${GPU_CHECK_FULL_S:-500}" python3 -m quadforge.tools.cli bench scale --json "$out/scale.json" \
    > "$out/scale.txt" 2>&1
  log "stage 3 exit $? ($(grep -m1 'GPU targets' "$out/scale.txt" || tail -1 "$out/scale.txt"))"
fi
log "done; logs in $out"
