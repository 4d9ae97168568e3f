#!/usr/bin/env bash
# The GPU checks of issue 23, in one call on a lent GPU machine (the `device` tool's `run`), inside a
# deadline: GPU_CHECK_BUDGET_S seconds (default 540) from the script's start. Every log and JSON lands
# under $OUT (they come back); each stage's time limit is the smaller of its own and what is left, so a
# slow stage leaves the later ones a chance and the call always ends inside its budget.
# Set-up first, as ../shared/gpu/README.md says (pack here, three `run` calls); that machine has no
# pytest, so its wheels go into the small pack too:
#   here, once:  bash ../shared/gpu/pack.sh && python3 -m pip download -q --no-deps --only-binary=:all: \
#                  --python-version 3.12 -d .gpu/small pytest pluggy iniconfig packaging pygments
#   run 1: carry [".gpu/small", ".gpu/w1", ".gpu/unpack.sh"]  command: bash .gpu/unpack.sh
#   run 2: carry [".gpu/w2", ".gpu/w3", ".gpu/unpack.sh"]     command: bash .gpu/unpack.sh
#   (vla_eval also needs the instruction encoder's package, wordllama, with its dependencies, ~32 MB
#    without numpy, tqdm and packaging, which that machine has; once here:
#      python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
#        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#        --platform manylinux1_x86_64 -d .gpu/lang wordllama && rm .gpu/lang/{numpy,tqdm,packaging}-*
#    and one more call before run 3, carry [".gpu/lang"], command:
#      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qf/lang .gpu/lang/*.whl
#    the H100 run of 2026-11-27 had no wordllama there, so its vla_eval stage stopped at the encoder)
#   run 3: carry [".gpu/w4", ".gpu/unpack.sh"]                command: bash .gpu/unpack.sh && bash tools/gpu_check.sh
# (later calls on the same warm machine, within its 30 s idle window: carry [".gpu/unpack.sh"], command
#  `QF_REINSTALL=1 bash .gpu/unpack.sh && GPU_CHECK_STAGES="..." bash tools/gpu_check.sh`).
#
# Stages (GPU_CHECK_STAGES, default "warm tests scale profile vla_eval quard expert ppo 16384 32768"), in this order:
#   warm     MuJoCo Warp's kernels compile cold in ~4-5 min when one process builds flat, rough and the
#            QUARD scene in turn (H100, 2026-11-26). Here three processes compile them side by side
#            (16 cores; Warp's kernel cache is shared), beside the trainers' GPU tests (torch only, ~40 s),
#            so the measuring stages after it find every kernel cached. Flat compiles inside the Warp tests.
#   tests    the GPU test lane, pytest -m gpu: the trainers on CUDA (started with warm) and the Warp tests
#            (the stream fix, graphed resets against uncaptured ones, Warp-on-CUDA equivalence with
#            mujoco_cpu flat and rough, the gait expert under both backends, and since 2026-11-27 the
#            QUARD scene on Warp equal to mujoco_cpu's: object poses, contact sensor, target pixels)
#   scale    bench scale --num-envs 4096: env and backend-only steps/s, env/backend, where a step goes,
#            buffers and memory per world, and the options table (solver 10/20, resets: forward, resets: step1,
#            task compiled: EnvConfig.compile_task, the task's score through torch.compile)
#   profile  bench warp_profile: GPU time per MuJoCo Warp function of one physics step at 4096 worlds
#            (MuJoCo Warp's testspeed, event trace), the scene as is and with collision variants
#   vla_eval the shipped VLA (experts/checkpoints/vla_rt1.pt) evaluated on Warp on CUDA, quard:all, 20
#            episodes per family, seed 7: the same command gave 95 of 100 on mujoco_cpu and 88 on Warp's
#            CPU device (docs/scale.md)
#   ppo      train-expert --preset legged_gym on flat ground, 4096 envs on Warp, networks on CUDA, for
#            GPU_CHECK_PPO_S (default 150) seconds: iteration time and the reward's climb (rsl_rl's log);
#            GPU_CHECK_PPO_FLAGS adds flags (e.g. "--warp-solver-iterations 10 --warp-ls-iterations 20"; "auto":
#            the reset recompute that measured faster in this machine's scale stage, and env.compile_task=True
#            when the compiled task measured faster there)
#   ppo_rough  (not default) the same on legged_gym's mixed terrain with its curriculum, for
#            GPU_CHECK_PPO_ROUGH_S (default 420) seconds: Curriculum/level/mean against time
#   quard    bench quard_gpu --quick: QUARD on Warp with the batch renderer, VLA training samples/s
#   expert   (after quard) bench scale's expert table at 4096 worlds on Warp: the gait expert
#            driving the env (a collection's control step) eager and with --compile-expert (torch.compile
#            needs Triton there: without it that row is NaN and the reason is in the output); into summary.txt
#   16384, 32768   bench scale --num-envs N: the large world counts
# Only the GPU's measuring stages run one at a time; compiles overlap.
# At most 8 files come back per call: summary.txt, pytest_train.txt, pytest_warp.txt, scale_4096.txt,
# profile.txt, vla_eval.txt, quard_gpu.txt (or ppo.txt / ppo_rough.txt in a call that runs them) and one
# JSON bundle (json.tar) holding every stage's JSON and the warmers' log. Times on an H100 (docs/scale.md):
# 2026-11-27 afternoon: warm and tests 187 s together (cold), scale 25 s, quard 28 s, 16384 27 s, 32768
# 29 s; evening: warm and tests 182 s, scale 23 s, profile 183 s (143 s of it compiling testspeed's own
# kernels), quard 23 s. The default stages do not fit one call's 600 s with ppo: run "warm tests scale
# profile vla_eval quard" first, then GPU_CHECK_STAGES="ppo" (GPU_CHECK_PPO_S=200 walked a flat Go1)
# in a second call on the warm machine (within its 30 s idle window: have the command ready).
set -uo pipefail
proj=$(pwd)
out=${OUT:-/tmp/gpu_check_out}
mkdir -p "$out" /tmp/gpu_check_json
export MUJOCO_GL=disable PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/qf/proj-site:/tmp/qf/site:/tmp/qf/lang${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-540}
log() { echo "[gpu_check $(date -u +%H:%M:%S) +$(( $(date +%s) - start ))s] $*" | tee -a "$out/summary.txt"; }
left() { echo $(( budget - ($(date +%s) - start) )); }
limit() {   # the smaller of a stage's own limit ($1) and what is left of the budget, at least 1
  local l; l=$(left); (( l < $1 )) && echo $(( l > 1 ? l : 1 )) || echo "$1"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, warp, mujoco_warp; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); \
print('warp', warp.__version__, 'mujoco_warp', getattr(mujoco_warp, '__version__', '?'))"; \
  git -C "$proj" log --oneline -1 2>/dev/null || true; } >> "$out/summary.txt" 2>&1
# what the machine can run (what was carried: Warp, wordllama, OpenGL), in the summary and as JSON
(cd /tmp && timeout 60 python3 -m quadforge.tools.cli info --warp --json "$out/info.json") >> "$out/summary.txt" 2>&1 || true
log "budget ${budget}s"

# cd away from the project root: its quadforge/ folder would shadow the installed package
cd /tmp
python3 -c "import pytest" 2>/dev/null || log "pytest is not installed here: add its wheels to .gpu/small (header)"
pytest_gpu() {   # pytest -m gpu over the given test modules, the project's ini, no cache
  python3 -m pytest "$@" -m gpu -v -rs -p no:cacheprovider --rootdir="$proj" -c "$proj/pyproject.toml"
}
stages=" ${GPU_CHECK_STAGES:-warm tests scale profile vla_eval quard expert ppo 16384 32768} "
want() { [[ "$stages" == *" $1 "* ]]; }

# builds one scene on cuda:0 and steps it through captures and resets, so its kernels land in the cache
warm_py='
import sys, torch
from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.builder import make_env
what = sys.argv[1]
warp = WarpConfig(device="cuda:0", on_overflow="terminate")
if what == "quard":
    env = make_env(task="quard:all", terrain=None, num_envs=16, seed=0, num_threads=2, backend="mujoco_warp",
                   warp=warp, task_options={"images": True})
else:
    env = make_env("go1", what, num_envs=64, num_threads=2, backend="mujoco_warp", warp=warp)
zeros = torch.zeros(env.num_envs, 12, device=env.device)
for _ in range(12):
    env.step(zeros)
env.reset_envs(torch.arange(4, device=env.device))
env.step(zeros)
print(what, "warm")
'

trainers=""
if want warm || want tests; then
  log "trainers' GPU tests (background)"
  timeout "$(limit 200)" bash -c "$(declare -f pytest_gpu); proj=$proj; pytest_gpu $proj/tests/training/test_train_on_gpu.py" \
    > "$out/pytest_train.txt" 2>&1 &
  trainers=$!
fi
warmers=()
if want warm; then
  for scene in mixed quard; do
    log "warm: compiling $scene's kernels (background)"
    timeout "$(limit 330)" python3 -c "$warm_py" "$scene" >> /tmp/gpu_check_json/warm.txt 2>&1 &
    warmers+=($!)
  done
fi
if want tests; then
  log "tests: pytest -m gpu, Warp (compiles flat's kernels; rough's come from the warmer beside it)"
  timeout "$(limit 360)" bash -c "$(declare -f pytest_gpu); proj=$proj; pytest_gpu $proj/tests/envs/test_mujoco_warp.py" \
    > "$out/pytest_warp.txt" 2>&1
  log "tests warp exit $? ($(tail -1 "$out/pytest_warp.txt"))"
fi
for w in "${warmers[@]}"; do wait "$w"; log "warmer exit $?"; done
[ -n "$trainers" ] && { wait "$trainers"; log "tests trainers exit $? ($(tail -1 "$out/pytest_train.txt"))"; }

scale() {   # bench scale --num-envs $1 for at most $2 seconds
  log "scale: bench scale --num-envs $1 (limit $(limit "$2") s)"
  timeout "$(limit "$2")" python3 -m quadforge.tools.cli bench scale --num-envs "$1" \
    --json "/tmp/gpu_check_json/scale_$1.json" > "/tmp/gpu_check_json/scale_$1.txt" 2>&1
  log "scale $1 exit $? ($(grep -m1 '| mujoco_warp' "/tmp/gpu_check_json/scale_$1.txt" || tail -1 "/tmp/gpu_check_json/scale_$1.txt"))"
}
if want scale; then
  scale 4096 150
  cp /tmp/gpu_check_json/scale_4096.txt "$out/"
fi
# GPU_CHECK_PPO_FLAGS=auto: the reset recompute (forward or step1) whose env steps/s was higher in this
# machine's scale stage (its options table), and the compiled task if it beat the defaults there, so PPO
# runs with what measured faster here
pick_reset() {
  python3 - <<'PY' 2>/dev/null || true
import json
t = json.load(open("/tmp/gpu_check_json/scale_4096.json"))["tables"]
rows = {r["variant"]: r["env steps/s"] for title, rs in t.items() if title.startswith("mujoco_warp options") for r in rs}
flags = []
if "resets: step1" in rows and "resets: forward" in rows:
    flags += ["--warp-reset-recompute", "step1" if rows["resets: step1"] >= rows["resets: forward"] else "forward"]
if rows.get("task compiled", 0) > rows.get("defaults", float("inf")):
    flags.append("env.compile_task=True")
print(*flags)
PY
}
ppo() {   # PPO, legged_gym preset, 4096 envs on Warp, terrain $1, for at most $2 seconds, rsl_rl's log to $3
  [ "${GPU_CHECK_PPO_FLAGS:-}" = auto ] && GPU_CHECK_PPO_FLAGS=$(pick_reset)
  log "ppo: legged_gym preset, $1 terrain, 4096 envs on Warp ${GPU_CHECK_PPO_FLAGS:-} (limit $(limit "$2") s)"
  # shellcheck disable=SC2086
  timeout "$(limit "$2")" python3 -m quadforge.tools.cli train-expert --preset legged_gym \
    --terrain "$1" --num-envs 4096 --iterations 1500 --backend mujoco_warp --warp-device cuda:0 --device cuda \
    --num-threads "$(nproc)" --out "/tmp/gpu_check_ppo_$1" --overwrite ${GPU_CHECK_PPO_FLAGS:-} > "$3" 2>&1
  log "ppo $1 exit $? ($(grep -c 'Learning iteration' "$3") iterations logged)"
}
if want profile; then
  log "profile: bench warp_profile (limit $(limit 240) s)"
  timeout "$(limit 240)" python3 -m quadforge.tools.cli bench warp_profile \
    --json /tmp/gpu_check_json/warp_profile.json > "$out/profile.txt" 2>&1
  log "profile exit $? ($(grep -m1 '| defaults' "$out/profile.txt" || tail -1 "$out/profile.txt"))"
fi
if want vla_eval && ! python3 -c "import wordllama" 2>/dev/null; then
  log "vla_eval: skipped, no wordllama here (the header says how to carry it)"
elif want vla_eval; then
  log "vla_eval: the shipped VLA on Warp on CUDA, quard:all 20 per family, seed 7 (limit $(limit 180) s)"
  timeout "$(limit 180)" python3 -m quadforge.tools.cli eval --task quard:all \
    --policy "$proj/experts/checkpoints/vla_rt1.pt" --colours train --episodes-per-cell 20 --num-envs 20 \
    --seed 7 --backend mujoco_warp --warp-device cuda:0 --out /tmp/gpu_check_json/vla_eval > "$out/vla_eval.txt" 2>&1
  log "vla_eval exit $? ($(tail -1 "$out/vla_eval.txt"))"
fi
want ppo && ppo flat "${GPU_CHECK_PPO_S:-150}" "$out/ppo.txt"
# the rough curriculum (Curriculum/level/mean in rsl_rl's log); not a default stage: its kernels are
# rough's (warm), and issue 23's 20 minutes do not fit a session's 15, so it shows progress per minute
want ppo_rough && ppo mixed "${GPU_CHECK_PPO_ROUGH_S:-420}" "$out/ppo_rough.txt"
if want quard; then
  log "quard: bench quard_gpu --quick (limit $(limit 120) s)"
  timeout "$(limit 120)" python3 -m quadforge.tools.cli bench quard_gpu --quick \
    --json /tmp/gpu_check_json/quard_gpu.json > "$out/quard_gpu.txt" 2>&1
  log "quard exit $? ($(tail -1 "$out/quard_gpu.txt"))"
fi
# bench scale's expert table alone (its --num-envs runs leave it out): a collection's control step on Warp
expert_py='
import sys
from quadforge.tools.bench.common import device_sync, report
from quadforge.tools.bench.scale import expert_table
report("scale_expert", [expert_table({"mujoco_warp": [int(sys.argv[1])]}, 10, 3, device_sync)], sys.argv[2])
'
if want expert; then
  log "expert: the gait expert driving 4096 Warp worlds, eager and --compile-expert (limit $(limit 240) s)"
  timeout "$(limit 240)" python3 -c "$expert_py" 4096 /tmp/gpu_check_json/expert.json \
    > /tmp/gpu_check_json/expert.txt 2>&1
  log "expert exit $?"
  cat /tmp/gpu_check_json/expert.txt >> "$out/summary.txt"
fi
for n in 16384 32768; do
  if want "$n"; then scale "$n" 120; cat "/tmp/gpu_check_json/scale_$n.txt" >> "$out/summary.txt"; fi
done
tar cf "$out/json.tar" -C /tmp/gpu_check_json . 2>/dev/null
log "done; logs in $out"
