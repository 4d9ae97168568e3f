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
# Stages (GPU_CHECK_STAGES, default "1 2 3 4"; timings from the H100 run of 2026-11-26, docs/scale.md):
#   1. the GPU test lane, pytest -m gpu: the trainers on CUDA (torch only, in the background; 25 tests,
#      ~40 s) beside the Warp tests (the stream fix, graphed resets, Warp-on-CUDA equivalence with
#      mujoco_cpu flat and rough, the gait expert under both backends), whose first tests compile
#      MuJoCo Warp's kernels cold: more than 260 s for flat + rough (~30 s once cached)
#   2. quadforge bench scale --quick: env and backend-only steps/s, env/backend, where a step goes
#      (ms in backend, task, resets, obs, rest), buffers and memory per
#      world at 4096 worlds (Go1, mixed terrain; build ~50 s)
#   3. PPO: train-expert --preset legged_gym on flat ground, 4096 envs on Warp, networks on CUDA: the
#      iteration time and the reward's first iterations (rsl_rl's log; ~2 s per iteration before the
#      graphed resets)
#   4. quadforge bench quard_gpu --quick: QUARD on Warp with the batch renderer (its kernels: ~1.5 min
#      more cold), VLA training samples/s
#   5. the large world counts: bench scale --num-envs 16384, then 32768 (kernels cached: a warm call)
#   6. PPO for GPU_CHECK_PPO_LONG_S (default 270) seconds: minutes to a walking flat policy
# The first call (cold kernels) runs 1-4 in one `run` of timeout_s 600; a second call on the warm machine
# (within 30 s, carry [".gpu/unpack.sh"]) runs GPU_CHECK_STAGES="5 6". At most 8 files come back from
# $OUT per call: stages 1-4 write 8.
# Limits per stage (seconds): GPU_CHECK_TEST_S (320), GPU_CHECK_BENCH_S (90), GPU_CHECK_PPO_S (60),
# GPU_CHECK_QUARD_S (90), GPU_CHECK_WORLDS_S (120 per world count), GPU_CHECK_PPO_LONG_S (270).
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
stages=" ${GPU_CHECK_STAGES:-1 2 3 4} "
want() { [[ "$stages" == *" $1 "* ]]; }
ppo() {   # PPO on flat ground, 4096 envs on Warp, for $1 seconds, rsl_rl's log to $2
  timeout "$1" python3 -m quadforge.tools.cli train-expert --preset legged_gym --terrain flat \
    --num-envs 4096 --iterations 1500 --backend mujoco_warp --warp-device cuda:0 --device cuda \
    --num-threads "$(nproc)" --out /tmp/gpu_check_ppo --overwrite > "$2" 2>&1
  log "PPO exit $? ($(grep -c 'Learning iteration' "$2") iterations logged)"
}

if want 1; then
  log "stage 1: pytest -m gpu (trainers in the background, Warp in front)"
  timeout "${GPU_CHECK_TEST_S:-320}" bash -c "$(declare -f pytest_gpu); proj=$proj; pytest_gpu $proj/tests/training/test_train_on_gpu.py" \
    > "$out/pytest_train.txt" 2>&1 &
  trainers=$!
  timeout "${GPU_CHECK_TEST_S:-320}" bash -c "$(declare -f pytest_gpu); proj=$proj; pytest_gpu $proj/tests/envs/test_mujoco_warp.py" \
    > "$out/pytest_warp.txt" 2>&1
  log "stage 1 warp exit $? ($(tail -1 "$out/pytest_warp.txt"))"
  wait $trainers
  log "stage 1 trainers exit $? ($(tail -1 "$out/pytest_train.txt"))"
fi
if want 2; then
  log "stage 2: bench scale --quick"
  timeout "${GPU_CHECK_BENCH_S:-90}" python3 -m quadforge.tools.cli bench scale --quick \
    --json "$out/scale_quick.json" > "$out/scale_quick.txt" 2>&1
  log "stage 2 exit $? ($(grep -m1 'GPU targets' "$out/scale_quick.txt" || tail -1 "$out/scale_quick.txt"))"
fi
if want 3; then
  log "stage 3: PPO, legged_gym preset, flat, 4096 envs on Warp"
  ppo "${GPU_CHECK_PPO_S:-60}" "$out/ppo.txt"
fi
if want 4; then
  log "stage 4: bench quard_gpu --quick"
  timeout "${GPU_CHECK_QUARD_S:-90}" python3 -m quadforge.tools.cli bench quard_gpu --quick \
    --json "$out/quard_gpu.json" > "$out/quard_gpu.txt" 2>&1
  log "stage 4 exit $? ($(tail -1 "$out/quard_gpu.txt"))"
fi
if want 5; then
  for n in 16384 32768; do
    log "stage 5: bench scale --num-envs $n"
    timeout "${GPU_CHECK_WORLDS_S:-120}" python3 -m quadforge.tools.cli bench scale --num-envs "$n" \
      --json "$out/scale_$n.json" > "$out/scale_$n.txt" 2>&1
    log "stage 5 exit $? ($(grep -m1 '| mujoco_warp' "$out/scale_$n.txt" || tail -1 "$out/scale_$n.txt"))"
  done
fi
if want 6; then
  log "stage 6: PPO for ${GPU_CHECK_PPO_LONG_S:-270} s (minutes to a walking flat policy)"
  ppo "${GPU_CHECK_PPO_LONG_S:-270}" "$out/ppo_long.txt"
fi
log "done; logs in $out"
