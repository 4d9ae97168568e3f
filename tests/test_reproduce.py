"""The reproduction command on shrunken sizes: stages write results.json, the report is rebuilt from it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from quadforge.data.episodes import EpisodeArrays
from quadforge.tools.cli import main as cli_main
from quadforge.tools.reproduce import ReproduceConfig, prefix, run_reproduction

torch.set_num_threads(1)


def _mini(tmp_path, **kw):
    base = dict(out=str(tmp_path / "run"), docs=str(tmp_path / "docs" / "results.md"), sizes=(120,),
                models=("mlp",), seeds=(0,), train_steps=2, batch_size=8, germ_episodes_clean=3,
                germ_episodes_noisy=3, germ_steps=2, eval_terrain="flat", eval_levels="0", eval_episodes=1,
                num_envs=2, max_episode_s=0.6, quick=True)
    base.update(kw)
    return ReproduceConfig(**base)


def test_prefix_is_nested_and_reaches_the_size():
    ends = np.array([30, 50, 90, 100])
    data = EpisodeArrays({"x": np.arange(100.0)}, ends, {"success": np.array([1, 0, 1, 1])})
    small, big = prefix(data, 40), prefix(data, 60)
    assert small.num_episodes == 2 and small.num_steps == 50
    assert big.num_episodes == 3 and np.array_equal(big.features["x"][:50], small.features["x"])
    assert prefix(data, 10_000).num_steps == 100   # capped at what there is
    assert list(small.episode_info["success"]) == [1, 0]


def test_config_errors():
    with pytest.raises(ValueError, match="--models"):
        ReproduceConfig(models=("gpt",)).validate()
    with pytest.raises(ValueError, match="--sizes"):
        ReproduceConfig(sizes=(10,)).validate()


def test_imitation_stage_writes_results_and_report(tmp_path):
    cfg = _mini(tmp_path)
    docs = run_reproduction(cfg, stages=("imitation",), log=lambda s: None)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    (row,) = results["imitation"]
    assert row["model"] == "mlp" and row["size"] == 120 and row["data_steps"] >= 120
    assert row["train_steps"] == 2 and 0.0 <= row["success"] <= 1.0 and row["episodes"] == 1
    assert results["expert_eval"]["episodes"] == 1
    text = docs.read_text()
    assert "| mlp | 120 |" in text and "Scaled down" in text
    assert "GeRM" in text and "_Not run yet._" in text      # the GeRM stage did not run
    # rebuilt from results.json alone, identically
    docs.unlink()
    assert cli_main(["reproduce", "--report-only", "--out", cfg.out, "--docs", str(docs)]) == 0
    assert docs.read_text() == text


@pytest.mark.slow
def test_germ_stage_runs_all_three_variants(tmp_path):
    cfg = _mini(tmp_path)
    run_reproduction(cfg, stages=("germ",), log=lambda s: None)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [r["model"] for r in results["germ"]] == ["germ", "germ-il", "germ-dense"]
    assert results["germ_data"]["episodes"] == 6
