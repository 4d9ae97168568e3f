"""`quadforge collect` in-process: a target count, resumption, fresh seeds, clear errors."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("quadforge.data.compaction")
pytest.importorskip("quadforge.experts.gait")

from quadforge.data.store import TrajectoryStore  # noqa: E402
from quadforge.data.validate import validate  # noqa: E402
from quadforge.tools.cli import main  # noqa: E402

torch.set_num_threads(1)
SMALL = ["--num-envs", "2", "--max-episode-s", "0.4", "--no-progress", "--seed", "3"]


def collect(capsys, out, episodes, *extra):
    assert main(["collect", "--store", str(out), "--episodes", str(episodes), *SMALL, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_collects_to_a_target_and_resumes_without_replaying(tmp_path, capsys):
    out = tmp_path / "store"
    first = collect(capsys, out, 3, "--compact-every", "2", "--skills", "walking=1,standing=1")
    assert first["collected"] == 3 and first["in_store"] == 3
    store = TrajectoryStore.open(out)
    assert validate(out).ok
    table = store.episodes
    assert list(table["episode_id"]) == [f"main-{i:08d}" for i in range(3)]
    assert set(table["task"]) <= {"walking", "standing"}
    assert set(table["terrain_type"]) == {"flat"} and set(table["policy_id"]) == {"gait:trot"}
    for i in range(3):
        row = table.row(i)
        assert row["label"]["rule"]["max_lin_vel_error"] == 0.35
        assert row["success"] == (row["failure_reason"] == "none")
    data = store.load(["actions", "commands", "time_outs", "terminated", "rewards", "joint_targets"])
    ends = np.asarray(table["end"])
    last = ends - 1
    # every episode ends in exactly one of time-out / termination, at its last step only
    assert np.array_equal(data["time_outs"][last] ^ data["terminated"][last], np.ones(3, bool))
    assert data["time_outs"].sum() + data["terminated"].sum() == 3

    again = collect(capsys, out, 3)                     # the target is met: nothing to do
    assert again["collected"] == 0 and again["in_store"] == 3

    more = collect(capsys, out, 5)                      # two more, new ids, a new seed
    assert more["collected"] == 2 and more["in_store"] == 5
    table = TrajectoryStore.open(out).episodes
    ids = list(table["episode_id"])
    assert len(set(ids)) == 5 and ids[3:] == ["main-00000003", "main-00000004"]
    assert table["seed"][3] != table["seed"][0]         # a resumed run does not replay the first
    assert validate(out).ok


@pytest.mark.parametrize("args,match", [
    (["--episodes", "0"], "--episodes"),
    (["--robot", "spot"], "go1"),
    (["--skills", "flying=1"], "unknown skills"),
    (["--terrain", "lava"], "terrain"),
    (["--policy", "/no/such/ckpt.pt"], "no such checkpoint"),
    (["--action-noise", "-1"], "--action-noise"),
    (["--max-episode-s", "0"], "--max-episode-s"),
    (["--num-envs", "0"], "--num-envs"),
    (["--workers", "-1"], "--workers"),
    (["--task", "quard:dance"], "quard:go_to"),
    (["--frame-stride", "0"], "--frame-stride"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, args, match):
    argv = ["collect", "--store", str(tmp_path / "s"), "--episodes", "2", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_collects_with_a_trained_checkpoint(tmp_path, capsys):
    pytest.importorskip("quadforge.experts.learned")
    from quadforge.layout import PROPRIO
    from quadforge.models.checkpoint import Checkpoint, save_checkpoint
    from quadforge.models import build_model

    torch.manual_seed(0)
    config = {"obs_dim": PROPRIO.dim, "action_dim": 12, "context": 4, "hidden": 16, "num_layers": 1,
              "decoder_hidden": 16}
    model = build_model("mlp", **config)
    ckpt = save_checkpoint(tmp_path / "mlp.pt", Checkpoint(model_name="mlp", model_config=config,
                                                           state_dict=model.state_dict(), layout=PROPRIO.to_dict()))
    out = tmp_path / "store"
    summary = collect(capsys, out, 2, "--policy", str(ckpt))
    assert summary["in_store"] == 2
    table = TrajectoryStore.open(out).episodes
    assert all(p.startswith("mlp") for p in table["policy_id"])


def test_same_seed_same_episodes(tmp_path, capsys):
    stores = []
    for name in ("a", "b"):
        collect(capsys, tmp_path / name, 3, "--action-noise", "0.05")
        stores.append(TrajectoryStore.open(tmp_path / name))
    a, b = (s.load(["actions", "dof_pos", "commands"]) for s in stores)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert list(stores[0].episodes["task"]) == list(stores[1].episodes["task"])


def test_out_must_not_be_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["collect", "--store", str(f), "--episodes", "1"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_an_unknown_quard_task_is_a_one_line_error_naming_the_tasks(tmp_path):
    from quadforge.collection.collect import CollectConfig
    with pytest.raises(ValueError, match="quard:go_to"):
        CollectConfig(out=str(tmp_path / "s"), episodes=1, task="quard:nope").validate()
