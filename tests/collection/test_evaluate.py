"""Evaluation: metrics, the sweep's cell bookkeeping on the scripted env, and a real-env run."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from collection_fakes import ZeroPolicy
from quadforge.evaluation.evaluate import EvalConfig, TimedPolicy, evaluate, parse_levels, run_round, terrain_types, write_outputs
from quadforge.evaluation.metrics import (episode_metrics, episodes_for_power, high_freq_energy, summarize,
                                          wilson_interval)
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.tools.cli import main as cli_main

torch.set_num_threads(1)


# --- metrics -------------------------------------------------------------------------------------------
def test_high_freq_energy_separates_slow_from_fast():
    t = np.arange(200) * 0.02
    slow = np.sin(2 * np.pi * 1.0 * t)[:, None]            # 1 Hz: all energy below 5 Hz
    fast = np.sin(2 * np.pi * 12.0 * t)[:, None]           # 12 Hz: all above
    assert high_freq_energy(slow, 0.02) < 0.01
    assert high_freq_energy(fast, 0.02) > 0.99
    mixed = np.concatenate([slow, fast], axis=1)           # equal energy per joint -> half
    assert high_freq_energy(mixed, 0.02) == pytest.approx(0.5, abs=0.02)
    noise = np.random.default_rng(0).standard_normal((2000, 12))
    # white noise: the share of frequency bins above 5 Hz of 25 Hz Nyquist
    assert high_freq_energy(noise, 0.02) == pytest.approx(0.8, abs=0.03)


def test_high_freq_energy_undefined_cases():
    assert math.isnan(high_freq_energy(np.ones((50, 12)), 0.02))      # constant actions
    assert math.isnan(high_freq_energy(np.random.rand(5, 12), 0.02))  # too short
    with pytest.raises(ValueError, match="dt"):
        high_freq_energy(np.random.rand(50, 12), 0.0)


def test_episode_metrics_and_summary():
    info = {"termination_reason": "fall", "success": False, "failure_reason": "fall", "return": 2.0,
            "lin_vel_error": 0.4, "ang_vel_error": 0.1, "distance": 1.5, "length": 30}
    m = episode_metrics(info, None, 0.02)
    assert m["fall"] == 1.0 and m["success"] == 0.0 and math.isnan(m["high_freq_energy"])
    ok = dict(info, termination_reason="time_out", success=True, failure_reason="none", **{"return": 4.0})
    s = summarize([m, episode_metrics(ok, np.random.rand(30, 12), 0.02)])
    assert s["episodes"] == 2 and s["success"] == 0.5 and s["fall"] == 0.5 and s["return"] == 3.0
    assert s["failure_reasons"] == {"fall": 1, "none": 1}
    assert math.isfinite(s["high_freq_energy"])            # the NaN of the first episode is skipped
    lo, hi = s["success_ci95"]
    assert 0 < lo < 0.5 < hi < 1
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


# --- argument parsing ----------------------------------------------------------------------------------
def test_levels_and_terrain_parsing():
    assert parse_levels("0-3") == [0, 1, 2, 3]
    assert parse_levels("5,1,1") == [1, 5]
    for bad in ("3-1", "a", "-1", ""):
        with pytest.raises(ValueError, match="--levels"):
            parse_levels(bad)
    assert terrain_types("stairs_up, slope_up") == ["stairs_up", "slope_up"]
    assert "gaps" in terrain_types("mixed")
    with pytest.raises(ValueError, match="allowed"):
        terrain_types("lava")


def test_config_errors_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--num-levels"):
        EvalConfig(levels="0-12", num_levels=10).validate()
    with pytest.raises(ValueError, match="--episodes"):
        EvalConfig(episodes=0).validate()
    with pytest.raises(ValueError, match="unknown skill|allowed"):
        EvalConfig(commands=["flying"]).validate()
    with pytest.raises(ValueError, match="--episodes"):
        EvalConfig(episodes=True).validate()            # a bool is no count
    assert EvalConfig(commands="walking", out=str(tmp_path / "w")).validate().commands == ["walking"]   # not w,a,l,..
    with pytest.raises(FileNotFoundError, match="--policy"):
        EvalConfig(policy=str(tmp_path / "missing.pt")).validate()
    assert cli_main(["eval", "--out", str(tmp_path), "--levels", "x"]) == 2


# --- the sweep's bookkeeping on the scripted env --------------------------------------------------------
class _CellEnv:
    """ScriptedEnv-like env whose episodes report the (type, level) the env was placed on; env i's k-th
    episode lasts 2 + (i + k) % 3 steps, so envs finish episodes at different rates."""

    def __init__(self, num_envs: int):
        from quadforge.layout import COMMAND_NAMES
        self.num_envs, self.dt, self.max_episode_length = num_envs, 0.02, 10
        self.device = torch.device("cpu")
        self.terrain_types = ("flat", "stairs_up")
        self.command_sampler = None
        self.commands = torch.zeros(num_envs, len(COMMAND_NAMES))
        self.joint_targets = torch.zeros(num_envs, 12)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self.k = torch.zeros(num_envs, dtype=torch.long)
        self.levels = torch.zeros(num_envs, dtype=torch.long)
        self.cols = torch.zeros(num_envs, dtype=torch.long)

    @property
    def terms(self):
        return {"commands": self.commands.clone(), "dof_pos": torch.zeros(self.num_envs, 12)}

    def set_terrain_levels(self, ids, levels, cols):
        self.levels[ids], self.cols[ids] = levels, cols
        self.episode_length_buf[ids] = 0
        self.k[ids] = 0

    def step(self, actions):
        self.episode_length_buf += 1
        length = 2 + (torch.arange(self.num_envs) + self.k) % 3
        dones = self.episode_length_buf >= length
        n = self.num_envs
        episode = {"termination_reason": torch.where(dones, 1, 0), "length": self.episode_length_buf.clone(),
                   "return": self.k.float(), "distance": torch.ones(n), "commanded_distance": torch.zeros(n),
                   "lin_vel_error": torch.zeros(n), "ang_vel_error": torch.zeros(n),
                   "terrain_type": self.cols.clone(), "terrain_level": self.levels.clone()}
        self.k += dones.long()
        self.episode_length_buf[dones] = 0
        return None, torch.ones(n), dones, {"time_outs": dones.clone(), "episode_end": episode}


@pytest.mark.parametrize("num_envs", [3, 4])
def test_run_round_keeps_first_episodes_of_each_cell_in_fixed_order(num_envs):
    env = _CellEnv(num_envs)
    rollout = Rollout(env, TimedPolicy(ZeroPolicy()), RolloutConfig(record=True))
    cells = [("flat", 2), ("stairs_up", 5)]
    got = run_round(env, rollout, cells, episodes=3, col_of={"flat": 0, "stairs_up": 1})
    assert set(got) == set(cells)
    for (ttype, level), eps in got.items():
        assert len(eps) == 3
        assert all(e.info["terrain_type"] == ttype and e.info["terrain_level"] == level for e in eps)
        # ordered by (episode index within the env, env id): returns carry the episode index k
        order = [(int(e.info["return"]), int(e.info["env_id"])) for e in eps]
        assert order == sorted(order)
        assert len(set(order)) == 3


def test_timed_policy_times_and_forwards():
    seen = []
    timed = TimedPolicy(ZeroPolicy(), before_act=lambda terms: seen.append(1))
    out = timed.act({"dof_pos": torch.zeros(2, 12)})
    assert out.shape == (2, 12) and len(timed.seconds) == 1 and seen == [1]
    assert timed.policy_id == "zero" and timed.action_space == "joint"


# --- a real (tiny) evaluation ---------------------------------------------------------------------------
def test_real_env_eval_is_seeded_and_writes_report(tmp_path):
    cfg = EvalConfig(policy="gait", out=str(tmp_path / "a"), terrain="flat,slope_up", levels="0,3", episodes=1,
                     num_envs=4, num_levels=4, max_episode_s=0.4, seed=3, progress=False)
    result = evaluate(cfg)
    assert [(c["terrain_type"], c["terrain_level"]) for c in result["cells"]] == \
        [("flat", 0), ("flat", 3), ("slope_up", 0), ("slope_up", 3)]
    assert all(c["episodes"] == 1 for c in result["cells"])
    assert len(result["episodes"]) == 4 and result["latency"]["calls"] >= 20
    for e in result["episodes"]:
        assert e["length"] <= 20 and 0.0 <= e["high_freq_energy"] <= 1.0
    paths = write_outputs(result, cfg.out)
    for key in ("json", "report", "success_png", "return_png"):
        assert paths[key].exists() and paths[key].stat().st_size > 0
    assert "slope_up" in paths["report"].read_text()
    again = evaluate(EvalConfig(**{**cfg.__dict__, "out": str(tmp_path / "b")}))
    strip = lambda r: [{k: v for k, v in e.items()} for e in r["episodes"]]  # noqa: E731
    assert json.dumps(strip(result), sort_keys=True) == json.dumps(strip(again), sort_keys=True)


# --- checkpoints -----------------------------------------------------------------------------------------
def _tiny_checkpoint(tmp_path):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from imitation_data import learnable_arrays

    from quadforge.training.imitation import train
    from quadforge.training.presets import preset
    cfg = preset("mlp", "cpu")
    cfg.max_steps, cfg.batch_size, cfg.val_every, cfg.tensorboard = 2, 8, 2, False
    return train(cfg, learnable_arrays(), tmp_path / "mlp").checkpoint


def test_checkpoint_policy_evaluates_and_a_term_mismatch_is_a_clear_error(tmp_path):
    from quadforge.models.checkpoint import load_checkpoint, save_checkpoint
    path = _tiny_checkpoint(tmp_path)
    cfg = EvalConfig(policy=str(path), out=str(tmp_path / "ok"), terrain="flat", levels="0", episodes=1, num_envs=2,
                     num_levels=2, max_episode_s=0.2, progress=False)
    result = evaluate(cfg)
    assert result["policy_id"].startswith("mlp:") and result["overall"]["episodes"] == 1
    # a checkpoint that claims another width for a term the env provides
    ckpt = load_checkpoint(path)
    ckpt.extra["term_dims"] = {**ckpt.extra["term_dims"], "dof_pos": 13}
    bad = save_checkpoint(tmp_path / "bad.pt", ckpt)
    with pytest.raises(ValueError, match="dof_pos"):
        evaluate(EvalConfig(**{**cfg.__dict__, "policy": str(bad)}))
    assert cli_main(["eval", "--policy", str(bad), "--terrain", "flat", "--levels", "0", "--num-levels", "2",
                     "--episodes", "1", "--num-envs", "2", "--out", str(tmp_path / "cli")]) == 2


def test_episodes_for_power_matches_the_textbook_sample_size_and_simulation():
    """Two-proportion z test, α 0.05 two-sided, 80 % power: 0.50 against 0.65 needs 167 per row; a
    simulated test at that size detects the difference about 80 % of the time."""
    assert episodes_for_power(0.50, 0.65) == 167
    assert episodes_for_power(0.65, 0.50) == 167
    assert episodes_for_power(0.5, 0.8) < episodes_for_power(0.5, 0.65) < episodes_for_power(0.5, 0.6)
    n = 167
    rng = np.random.default_rng(0)
    a, b = rng.binomial(n, 0.50, 4000), rng.binomial(n, 0.65, 4000)
    p = (a + b) / (2 * n)
    z = (b - a) / n / np.sqrt(p * (1 - p) * 2 / n)
    assert 0.75 < float((np.abs(z) > 1.96).mean()) < 0.85
    with pytest.raises(ValueError, match="must differ"):
        episodes_for_power(0.5, 0.5)


def test_a_rerun_into_an_earlier_report_says_so_and_leaves_none_of_its_files(tmp_path, capsys):
    """`eval --video` then `eval --out` the same folder without it left the first policy's GIF beside the
    second's report; `eval-expert` refused its own earlier folder. Both replace it now, and say so."""
    from quadforge.evaluation.evaluate import replace_earlier_report
    from quadforge.output_paths import check_output_dir, is_eval_dir
    for name in ("eval.json", "report.md", "episode.gif", "success_vs_level.png", "frames_go_to_train.png",
                 "experts_success_vs_level.png", "notes.txt"):
        (tmp_path / name).write_text("earlier")
    replace_earlier_report(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experts_success_vs_level.png", "notes.txt"]
    assert "eval: replacing the earlier evaluation in" in capsys.readouterr().out
    report = tmp_path / "expert"
    (report / "0_gait").mkdir(parents=True)
    (report / "expert_report.json").write_text("{}")
    assert is_eval_dir(report) and check_output_dir(report, "evaluation report", owns=is_eval_dir) == report


def test_eval_tracking_checks_its_level_before_any_rollout(capsys):
    assert cli_main(["eval-tracking", "--policy", "gait", "--level", "10"]) == 2
    assert "--level=10 is invalid; allowed: an integer in [0, 9]" in capsys.readouterr().err
