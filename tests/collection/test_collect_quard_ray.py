"""`collect --task quard:go_to --policy quard_expert --workers 1`: a Ray actor writes the same QUARD store
as the same collector in this process - frames, the instruction table and the task parameters included."""
import json

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("quadforge.envs.quard.env")

from quadforge.data.store import TrajectoryStore  # noqa: E402
from quadforge.data.validate import validate  # noqa: E402
from quadforge.tools.cli import main  # noqa: E402


@pytest.mark.slow
def test_ray_worker_writes_the_quard_store_the_in_process_collector_writes(tmp_path, capsys):
    common = ["collect", "--task", "quard:go_to", "--policy", "quard_expert", "--episodes", "2", "--num-envs", "2",
              "--seed", "3", "--no-progress"]
    ray_store, local_store = tmp_path / "ray", tmp_path / "local"
    assert main(common + ["--store", str(ray_store), "--workers", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["in_store"] == 2 and [r["collector_id"] for r in summary["runs"]] == ["main.w0"]
    # the Ray actor's collector id is main.w0: the same id in this process draws the same run seed
    assert main(common + ["--store", str(local_store), "--collector-id", "main.w0"]) == 0

    assert validate(ray_store).ok
    a, b = TrajectoryStore.open(ray_store), TrajectoryStore.open(local_store)
    assert a.image_features == ("images/front_rgb",) and a.frame_stride("images/front_rgb") == 10
    frames = a.array("images/front_rgb")[:]
    assert frames.dtype == np.uint8 and frames.shape[1:] == (64, 64, 3) and frames.max() > 0
    assert int(a.frame_counts("images/front_rgb").sum()) == frames.shape[0]
    for i in range(2):
        params = a.task_params(i)
        assert params["family"] == "go_to" and a.instruction_text(i) == params["instruction"]
        assert params == b.task_params(i)
    # the instruction table: every per-step index names an instruction of the episode's task
    assert a.instructions == b.instructions and a.tasks == b.tasks
    steps = a.array("instruction")[:]
    ends = a.episode_ends
    for i, (start, end) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        assert {a.instructions[k] for k in np.unique(steps[start:end])} == {a.task_params(i)["instruction"]}
    # and everything else arrives as the in-process collector writes it
    assert a.feature_names == b.feature_names
    for name in a.feature_names:
        assert np.array_equal(a.array(name)[:], b.array(name)[:]), name
    ca, cb = a.episodes.columns(), b.episodes.columns()
    assert list(ca) == list(cb)
    for column in ca:
        assert list(ca[column]) == list(cb[column]), column
