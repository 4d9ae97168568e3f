"""`--workers 2`: two local Ray actors, each its own collector id, all through staging."""
import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("quadforge.data.compaction")
pytest.importorskip("quadforge.experts.gait")

from quadforge.collection.distributed import quotas  # noqa: E402
from quadforge.data.store import TrajectoryStore  # noqa: E402
from quadforge.data.validate import validate  # noqa: E402
from quadforge.tools.cli import main  # noqa: E402


def test_quotas_split_evenly():
    assert quotas(7, 3) == [3, 2, 2] and sum(quotas(1, 4)) == 1 and quotas(0, 2) == [0, 0]


@pytest.mark.slow
def test_two_ray_workers_reach_the_target_and_a_rerun_tops_up(tmp_path, capsys):
    out = tmp_path / "store"
    argv = ["collect", "--store", str(out), "--num-envs", "2", "--max-episode-s", "0.3", "--workers", "2",
            "--compact-every", "2", "--no-progress"]
    assert main(argv + ["--episodes", "6"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["collected"] == 6 and summary["in_store"] == 6
    assert {r["collector_id"] for r in summary["runs"]} == {"main.w0", "main.w1"}
    assert [r["episodes"] for r in summary["runs"]] == [3, 3]
    assert validate(out).ok
    table = TrajectoryStore.open(out).episodes
    assert set(table["collector_id"]) == {"main.w0", "main.w1"}
    assert len(set(table["episode_id"])) == 6
    assert len(set(table["seed"])) == 2                    # each worker its own seed

    assert main(argv + ["--episodes", "7"]) == 0           # top up by one, ids continue per collector
    table = TrajectoryStore.open(out).episodes
    ids = set(table["episode_id"])
    assert len(ids) == 7 and "main.w0-00000003" in ids
