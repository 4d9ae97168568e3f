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
        and "_reset_envs" not in env.__dict__   # the class's own again
    env.close()


@pytest.mark.parametrize("variant", ["defaults", "no self-collision", "no hip rotors", "flat ground"])
def test_the_warp_profile_scene_stands_and_its_variants_change_only_what_collides(variant):
    """bench warp_profile hands MuJoCo Warp's testspeed a standing robot: zero controls hold the
    default pose (MuJoCo C here), only the feet touch the ground, and the variants touch no dynamics."""
    import mujoco
    import numpy as np
    from quadforge.envs.robots import get_robot
    from quadforge.tools.bench.warp_profile import standing_scene
    m, ref = standing_scene(variant), standing_scene("flat ground" if variant == "flat ground" else "defaults")
    assert np.array_equal(m.actuator_biasprm, ref.actuator_biasprm) and np.array_equal(m.body_mass, ref.body_mass)
    robot_geoms = m.geom_bodyid > 0
    if variant == "no self-collision":   # every robot geom still meets the ground, never another robot geom
        ct, ca = m.geom_contype[robot_geoms], m.geom_conaffinity[robot_geoms]
        assert ((ct[:, None] & ca[None, :]) == 0).all() and ((ct & 1) | (ca & 1)).all()
    if variant == "no hip rotors":
        cyl = m.geom_type == mujoco.mjtGeom.mjGEOM_CYLINDER
        assert cyl.sum() == 4 and (m.geom_contype[cyl] == 0).all() and (m.geom_contype[~cyl & robot_geoms] > 0).all()
    d = mujoco.MjData(m)
    mujoco.mj_resetData(m, d)
    for _ in range(400):                 # 2 s: the drop, the fold into the default pose, standing
        mujoco.mj_step(m, d)
    robot = get_robot("go1")
    q0, ground_z = np.asarray(robot.default_joint_pos), m.qpos0[2] - (robot.thigh_length + robot.calf_length
                                                                       + robot.foot_radius + 0.05)
    assert d.xmat[1][8] > 0.98 and d.qpos[2] - ground_z > 0.2 and np.abs(d.qvel).max() < 0.05
    # the default pose, the calves sagging under the weight (PD targets, no feed-forward: 0.2-0.4 rad)
    assert np.abs(d.qpos[7:] - q0).max() < 0.5
    feet = {mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, f"{leg}_foot") for leg in ("FR", "FL", "RR", "RL")}
    touching = {int(g) for g in d.contact.geom[: d.ncon].ravel()} - {0}
    assert d.ncon >= 4 and touching <= feet


def test_bench_warp_profile_says_it_needs_a_gpu(capsys):
    from quadforge.tools.bench import warp_profile
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would measure")
    assert warp_profile.main(quick=True) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--num-envs 0: the number of worlds"):
        warp_profile.main(quick=True, num_envs=0)


def test_ray_actors_ask_for_a_gpu_only_when_their_physics_runs_on_cuda():
    from quadforge.collection.collect import CollectConfig
    from quadforge.collection.distributed import actor_gpus
    from quadforge.envs.backends.base import WarpConfig
    cfg = CollectConfig(out="s", episodes=1)
    assert actor_gpus(cfg) == 0
    assert actor_gpus(CollectConfig(out="s", episodes=1, backend="mujoco_warp")) == 0   # device auto: no request
    assert actor_gpus(CollectConfig(out="s", episodes=1, backend="mujoco_warp", warp=WarpConfig(device="cpu"))) == 0
    assert actor_gpus(CollectConfig(out="s", episodes=1, backend="mujoco_warp", warp=WarpConfig(device="cuda"))) == 1


def test_a_variant_that_cannot_run_keeps_the_options_table(monkeypatch, capsys):
    """On a GPU machine without Triton the compiled-task variant raises; the other rows stay measured."""
    import math

    from quadforge.tools.bench import scale
    row = {"env": 2.0, "backend_rate": 4.0, "share": 0.5, **{k: 1.0 for k in scale.BREAKDOWN},
           "niter_mean": 3.0, "niter_max": 5, "overflowed": 0}

    def measure_one(backend, n, steps, rounds, sync, env_overrides=None, **options):
        if env_overrides:
            raise RuntimeError("Cannot find a working triton installation")
        return row
    monkeypatch.setattr(scale, "measure_one", measure_one)
    table = scale.variant_table(8, row, 1, 1, lambda: None)
    by_label = {r["variant"]: r for r in table.records()}
    assert list(by_label) == [label for label, _, _ in scale.VARIANTS]
    assert by_label["defaults"]["env/backend"] == 0.5 and by_label["resets: step1"]["env steps/s"] == 2.0
    assert math.isnan(by_label["task compiled"]["env steps/s"])
    assert "'task compiled' failed: RuntimeError: Cannot find a working triton" in capsys.readouterr().out


def test_bench_scale_times_the_gait_expert_driving_the_env():
    from quadforge.tools.bench.scale import expert_rates
    r = expert_rates("mujoco_cpu", 2, 3, 1, lambda: None, compiled=False)
    assert r["rate"] > 0 and r["act ms"] > 0 and 0 < r["act share"] < 1 and r["first s"] > 0


def test_a_compiled_expert_that_cannot_run_is_a_row_of_nan(monkeypatch, capsys):
    """A GPU machine without Triton cannot compile the expert: the eager row stays measured."""
    import math

    from quadforge.tools.bench import scale

    def no_triton(*policies):
        raise RuntimeError("Cannot find a working triton installation")
    monkeypatch.setattr(scale, "compile_experts", no_triton)
    eager, compiled = scale.expert_table({"mujoco_cpu": [2, 4]}, 2, 1, lambda: None).records()
    assert eager["worlds"] == compiled["worlds"] == 2 and eager["control steps x worlds /s"] > 0
    assert math.isnan(compiled["control steps x worlds /s"]) and math.isnan(compiled["compiled/eager rate"])
    assert "--compile-expert failed: RuntimeError: Cannot find a working triton" in capsys.readouterr().out
