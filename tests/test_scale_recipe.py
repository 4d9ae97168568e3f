"""docs/scale.md's multi-process recipe, run as written: `torchrun --standalone --nproc_per_node 2` over
the `quadforge` CLI for imitation, GeRM and PPO (gloo on the CPU here; the same commands take nccl with
`--device cuda`), and `quadforge bench scale`'s measuring loop. Slow: every rank is a fresh Python
process importing torch (~10 s each on this shared machine)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def _store(path: Path, n: int = 8) -> Path:
    from quadforge.data.compaction import compact
    from quadforge.data.writer import StagingWriter
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    rng = np.random.default_rng(0)
    w = StagingWriter(path, "c0")
    for i in range(n):
        w.write_episode(synthetic_episode(rng, int(rng.integers(10, 20)), i % 4 != 3), synthetic_info(i, i % 4 != 3))
    compact(path)
    return path


def _torchrun(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(TORCHRUN + ["-m", "quadforge.tools.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.mark.slow
def test_torchrun_imitation_and_germ_on_two_cpu_ranks(tmp_path):
    from quadforge.models.checkpoint import load_checkpoint
    store = _store(tmp_path / "store")
    _torchrun(["train", "--model", "mlp", "--store", str(store), "--out", str(tmp_path / "fc"), "--device", "cpu",
               "--max-steps", "4", "--batch-size", "8", "--val-every", "2", "model.hidden=8", "tensorboard=False"],
              tmp_path)
    assert load_checkpoint(tmp_path / "fc" / "last.pt").step == 4
    _torchrun(["train", "--model", "germ", "--store", str(store), "--out", str(tmp_path / "germ"), "--device", "cpu",
               "--max-steps", "2", "--batch-size", "8", "model.num_layers=1", "model.d_model=16",
               "model.num_heads=2", "model.ffn_hidden=16", "model.num_bins=16", "model.context=3", "val_every=2"],
              tmp_path)
    assert load_checkpoint(tmp_path / "germ" / "last.pt").step == 2


@pytest.mark.slow
def test_torchrun_ppo_on_two_cpu_ranks(tmp_path):
    log = _torchrun(["train-expert", "--out", str(tmp_path / "ppo"), "--num-envs", "2", "--iterations", "2",
                     "--device", "cpu", "num_steps_per_env=4", "actor_hidden_dims=[16]", "critic_hidden_dims=[16]",
                     "save_interval=1", "num_learning_epochs=1", "num_mini_batches=1", "env.episode_length_s=0.1"],
                    tmp_path)
    # both ranks joined rsl_rl's parameter broadcast; rank 0 alone wrote the checkpoints
    assert "Synchronizing parameters for rank 1" in log and "Synchronizing parameters for rank 0" in log
    ckpt = torch.load(tmp_path / "ppo" / "model_1.pt", weights_only=True)
    assert ckpt["iter"] == 1 and ckpt["infos"]["quadforge"]["robot"] == "go1"


@pytest.mark.slow
def test_bench_scale_measures_each_backend_it_is_given():
    from quadforge.tools.bench.scale import measure
    table = measure({"mujoco_cpu": [2, 4]}, steps=2, rounds=1)
    rows = table.records()
    assert [r["worlds"] for r in rows] == [2, 4]
    assert all(r["env steps/s"] > 0 and r["backend steps/s"] > 0 and r["build s"] > 0 for r in rows)
    # where the step goes: every part took time, the backend most of it
    assert all(r["ms/step: backend"] > 0 and r["task"] > 0 and r["obs"] > 0 and r["resets"] >= 0 for r in rows)


def test_the_step_breakdown_restores_the_env_and_counts_resets():
    from quadforge.envs.builder import make_env
    from quadforge.tools.bench.scale import step_breakdown
    env = make_env("go1", "flat", num_envs=2, num_threads=1, overrides={"episode_length_s": 0.04})
    zeros = torch.zeros(2, 12)
    parts = step_breakdown(env, zeros, 4, lambda: None)      # a 2-step episode: resets in the 4 steps
    assert set(parts) == {"backend", "task", "resets", "resets: backend", "obs", "rest"}
    assert parts["backend"] > 0 and parts["resets"] > 0 and parts["obs"] > 0
    # the backend's reset is inside the env's resets: reported beside them, not subtracted twice
    assert 0 < parts["resets: backend"] <= parts["resets"]
    assert "step" not in env.backend.__dict__ and "reset" not in env.backend.__dict__ \
        and "reset_envs" not in env.__dict__   # the class's own again
    env.close()



def test_ray_actors_ask_for_a_gpu_only_when_their_physics_runs_on_cuda():
    from quadforge.collection.collect import CollectConfig
    from quadforge.collection.distributed import actor_gpus
    from quadforge.envs.backends.base import WarpConfig
    cfg = CollectConfig(out="s", episodes=1)
    assert actor_gpus(cfg) == 0
    assert actor_gpus(CollectConfig(out="s", episodes=1, backend="mujoco_warp")) == 0   # device auto: no request
    assert actor_gpus(CollectConfig(out="s", episodes=1, backend="mujoco_warp", warp=WarpConfig(device="cpu"))) == 0
    assert actor_gpus(CollectConfig(out="s", episodes=1, backend="mujoco_warp", warp=WarpConfig(device="cuda"))) == 1
