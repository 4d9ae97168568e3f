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
# Stages (one H100, first call: MuJoCo Warp's kernels compile cold, ~4-5 min, inside stage 1):
#   1. the GPU test lane, pytest -m gpu: the trainers on CUDA (torch only, in the background) beside the
#      Warp tests (the stream fix, Warp-on-CUDA equivalence with mujoco_cpu flat and rough, the gait
#      expert under both backends), whose first test compiles the kernels
#   2. quadforge bench scale --quick: env and backend-only steps/s, env/backend, buffers and memory per
#      world at 4096 worlds (Go1, mixed terrain)
#   3. PPO: train-expert --preset legged_gym on flat ground, 4096 envs on Warp, networks on CUDA: the
#      iteration time and the reward's first iterations (rsl_rl's log)
#   4. quadforge bench quard_gpu --quick: QUARD on Warp with the batch renderer, VLA training samples/s
#   5. GPU_CHECK_FULL=1 only: the full scale sweep (4096 / 16384 / 32768 worlds and a cold compile)
# Limits per stage (seconds): GPU_CHECK_TEST_S (260), GPU_CHECK_BENCH_S (100), GPU_CHECK_PPO_S (75),
# GPU_CHECK_QUARD_S (100), GPU_CHECK_FULL_S (500, a later call: kernels cached on the warm machine).
# Stages 1-4 fit one `run` of timeout_s 600 (at most 8 files come back from $OUT: this writes 8).
set -uo pipefail
proj=$(pwd)
out=${OUT:-/tmp/gpu_check_out}
mkdir -p "$out"
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/qf/proj-site:/tmp/qf/site${PYTHONPATH:+:$PYTHONPATH}
log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }

{ nvidia-smi; python3 -c "import torch, warp, mujoco_warp; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0)); print('warp', warp.__version__, 'mujoco_warp', getattr(mujoco_warp, '__version__', '?'))"; \
  git -C "$proj" log --oneline -1 2>/dev/null || true; } >> "$out/summary.txt" 2>&1
log "machine: $(grep -m1 -o 'NVIDIA [A-Z0-9 ]*[0-9]' "$out/summary.txt" || echo unknown)"

# cd away from the project root: its quadforge/ folder would shadow the installed package
cd /tmp
python3 -c "import pytest" 2>/dev/null || log "pytest is not installed here: add its wheels to .gpu/small (header)"
pytest_gpu() {   # pytest -m gpu over the given test modules, the project's ini, no cache
  python3 -m pytest "$@" -m gpu -v -rs -p no:cacheprovider --rootdir="$proj" -c "$proj/pyproject.toml"
}
log "stage 1: pytest -m gpu (trainers in the background, Warp in front)"
timeout "${GPU_CHECK_TEST_S:-260}" bash -c "$(declare -f pytest_gpu); proj=$proj; pytest_gpu $proj/tests/training/test_train_on_gpu.py" \
  > "$out/pytest_train.txt" 2>&1 &
trainers=$!
timeout "${GPU_CHECK_TEST_S:-260}" bash -c "$(declare -f pytest_gpu); proj=$proj; pytest_gpu $proj/tests/envs/test_mujoco_warp.py" \
  > "$out/pytest_warp.txt" 2>&1
log "stage 1 warp exit $? ($(tail -1 "$out/pytest_warp.txt"))"
wait $trainers
log "stage 1 trainers exit $? ($(tail -1 "$out/pytest_train.txt"))"

log "stage 2: bench scale --quick"
timeout "${GPU_CHECK_BENCH_S:-100}" python3 -m quadforge.tools.cli bench scale --quick \
  --json "$out/scale_quick.json" > "$out/scale_quick.txt" 2>&1
log "stage 2 exit $? ($(grep -m1 'GPU targets' "$out/scale_quick.txt" || tail -1 "$out/scale_quick.txt"))"

log "stage 3: PPO, legged_gym preset, flat, 4096 envs on Warp"
timeout "${GPU_CHECK_PPO_S:-75}" python3 -m quadforge.tools.cli train-expert --preset legged_gym --terrain flat \
  --num-envs 4096 --iterations 40 --backend mujoco_warp --warp-device cuda:0 --device cuda \
  --num-threads "$(nproc)" --out /tmp/gpu_check_ppo --overwrite > "$out/ppo.txt" 2>&1
log "stage 3 exit $? ($(grep -c 'Learning iteration' "$out/ppo.txt") iterations logged)"

log "stage 4: bench quard_gpu --quick"
timeout "${GPU_CHECK_QUARD_S:-100}" python3 -m quadforge.tools.cli bench quard_gpu --quick \
  --json "$out/quard_gpu.json" > "$out/quard_gpu.txt" 2>&1
log "stage 4 exit $? ($(tail -1 "$out/quard_gpu.txt"))"

if [ -n "${GPU_CHECK_FULL:-}" ]; then
  log "stage 5: bench scale (full sweep)"
  timeout "${GPU_CHECK_FULL_S:-500}" python3 -m quadforge.tools.cli bench scale --json "$out/scale.json" \
    > "$out/scale_quick.txt" 2>&1
  log "stage 5 exit $? ($(grep -m1 'GPU targets' "$out/scale_quick.txt" || tail -1 "$out/scale_quick.txt"))"
fi
log "done; logs in $out"
