"""throughput.measure runs both loops and reports comparable rates (speed itself is a benchmark)."""
import pytest
import torch

pytest.importorskip("quadforge.experts.gait")
pytest.importorskip("quadforge.data.staging")

from quadforge.collection.throughput import measure  # noqa: E402


def test_measure_reports_both_rates_and_writes_episodes():
    torch.set_num_threads(1)
    r = measure(num_envs=2, steps=20, repeats=1, episode_s=0.2)
    assert r["env_steps_per_s"] > 0 and r["collect_steps_per_s"] > 0
    assert r["ratio"] == pytest.approx(r["collect_steps_per_s"] / r["env_steps_per_s"])
    assert r["episodes_written"] >= 2          # 20 steps of 0.02 s with 0.2 s episodes: 2 per env at least
    with pytest.raises(ValueError, match="steps"):
        measure(num_envs=2, steps=0)
