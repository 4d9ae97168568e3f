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
    (["--skills", "flying=1"], "--skills 'flying=1': unknown skills"),
    (["--terrain", "lava"], "terrain"),
    (["--policy", "/no/such/ckpt.pt"], "no such checkpoint"),
    (["--action-noise", "-1"], "--action-noise"),
    (["--max-episode-s", "0"], "--max-episode-s"),
    (["--num-envs", "0"], "--num-envs"),
    (["--workers", "-1"], "--workers"),
    (["--task", "quard:dance"], "quard:go_to"),
    (["--frame-stride", "0"], "--frame-stride"),
    (["--expert-drive-prob", "0.5"], "it needs --relabel"),                  # was ignored without it
    (["--workers", "1", "--address", "127.0.0.1:1"], "no Ray cluster answers there"),   # ray.init retried minutes
    (["--workers", "1", "--address", "headnode"], "give HOST:PORT"),
    (["--policy", "gait", "--relabel", "nosuch"], "--relabel 'nosuch' is unknown"),
    # staging and compaction skip hidden files: a ".x" collector's episodes would never be merged
    (["--collector-id", ".x"], "--collector-id='.x' is invalid"),
    (["--collector-id", "a/b"], "--collector-id='a/b' is invalid"),
    (["--max-episode-s", "0.001"], "--max-episode-s=0.001 is invalid; allowed: >= the control dt 0.02 s"),
    # settings of the other kind of task are refused, not dropped without a word
    (["--task", "quard:go_to", "--skills", "running=1"], "--skills applies to --task locomotion"),
    (["--task", "quard:go_to", "--max-episode-s", "1"], "--max-episode-s applies to --task locomotion"),
    (["--frame-stride", "3"], "--frame-stride applies to the camera tasks"),
    (["--address", "127.0.0.1:1"], "give --workers"),
    (["--warp-nconmax", "5"], "--warp-nconmax: option(s) of --backend mujoco_warp; this run's backend is mujoco_cpu"),
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


def test_compaction_schedule_by_count_or_time_whichever_first():
    from quadforge.collection.collect import CompactionSchedule
    now = [0.0]
    s = CompactionSchedule(every=10, every_s=60.0, clock=lambda: now[0])
    assert not s.due(9)
    assert s.due(10)                       # by count
    s.compacted(10)
    now[0] = 59.0
    assert not s.due(12)
    now[0] = 60.0
    assert s.due(12) and not s.due(10)     # by time, and only with new episodes
    s.compacted(12)
    assert not CompactionSchedule(0, 0.0, clock=lambda: now[0]).due(10 ** 6)   # both off: only at the end
    with pytest.raises(ValueError, match="--compact-every-s"):
        from quadforge.collection.collect import CollectConfig
        CollectConfig(out="s", episodes=1, compact_every_s=float("nan")).validate()


def test_compaction_never_takes_more_than_its_share_of_a_large_collection():
    """A compaction's cost grows with the store's episode table: after one that took d seconds the next
    waits 9 d, whatever the count or time says, so compacting stays within a tenth of the wall time."""
    from quadforge.collection.collect import MAX_COMPACTION_SHARE, CompactionSchedule
    now = [0.0]

    def slow_compaction():   # a store so large that a compaction takes 20 s
        now[0] += 20.0
    s = CompactionSchedule(every=10, every_s=60.0, clock=lambda: now[0])
    s.compact(10, slow_compaction)
    gap = 20.0 * (1 - MAX_COMPACTION_SHARE) / MAX_COMPACTION_SHARE   # 180 s
    now[0] += gap - 1.0
    assert not s.due(500)                  # 490 new episodes and 179 s: still too soon
    now[0] += 1.0
    assert s.due(500)
    s.compact(500, lambda: None)           # a quick one: the count and time rule again
    assert s.due(510)


def test_collection_compacts_by_time_so_a_stopped_run_leaves_a_readable_store(tmp_path, capsys, monkeypatch):
    import quadforge.collection.collect as collect_module
    monkeypatch.setattr(collect_module, "MAX_COMPACTION_SHARE", 1.0)   # no wait after a compaction here
    out = tmp_path / "store"
    collect(capsys, out, 3, "--compact-every", "0", "--compact-every-s", "1e-9")
    assert TrajectoryStore.open(out).generation == 3       # one compaction per episode, none left at the end
    out = tmp_path / "store2"
    collect(capsys, out, 3, "--compact-every", "0", "--compact-every-s", "0")
    assert TrajectoryStore.open(out).generation == 1       # only the final one


def test_pushed_steps_are_stored_and_an_older_store_without_the_column_still_collects(tmp_path, capsys):
    """`pushed` marks the steps after whose reward the env pushed (the next observation is after the push):
    every push_interval steps of the env's clock; a store written before the column keeps its schema."""
    out = tmp_path / "store"
    collect(capsys, out, 4, "--push", "1.0", "--push-interval-s", "0.1")   # 5 control steps at 50 Hz
    store = TrajectoryStore.open(out)
    assert store.schema.features["pushed"].dtype == "bool"
    table, pushed = store.episodes, store.load(["pushed"])["pushed"]
    clock: dict[int, int] = {}   # steps each env ran before this episode (its episodes are back to back)
    for i in range(len(table)):
        env_id, start, end = table["extra"][i]["env_id"], table["start"][i], table["end"][i]
        c0 = clock.get(env_id, 0)
        want = (np.arange(c0, c0 + end - start) + 1) % 5 == 0
        np.testing.assert_array_equal(pushed[start:end], want)
        clock[env_id] = c0 + end - start
    assert pushed.any()

    # an "old" store: the same episodes without the column, as stores were written before it
    from quadforge.data.compaction import compact
    from quadforge.data.writer import StagingWriter
    old = tmp_path / "old"
    data = store.load()
    with StagingWriter(old, "main") as w:
        for i in range(2):
            lo, hi = table["start"][i], table["end"][i]
            w.write_episode({k: v[lo:hi] for k, v in data.items() if k != "pushed"},
                            {**table.row(i)["extra"], "robot": "go1", "control_dt": 0.02,
                             "success": bool(table["success"][i])})
    compact(old)
    assert "pushed" not in TrajectoryStore.open(old).schema.features
    assert collect(capsys, old, 4, "--push", "1.0")["in_store"] == 4   # resumes without the column
    assert "pushed" not in TrajectoryStore.open(old).schema.features and validate(old).ok


def test_compile_task_collects_the_eager_episodes_within_rounding(tmp_path, capsys, compiled_env):
    """--compile-task: the same steps stored and the same labels; returns equal within float rounding."""
    collect(capsys, tmp_path / "eager", 4, "--action-noise", "0.3")
    collect(capsys, tmp_path / "compiled", 4, "--action-noise", "0.3", "--compile-task")
    eager, compiled = TrajectoryStore.open(tmp_path / "eager"), TrajectoryStore.open(tmp_path / "compiled")
    a, b = (s.load(["actions", "dof_pos", "rewards"]) for s in (eager, compiled))
    assert np.array_equal(a["actions"], b["actions"]) and np.array_equal(a["dof_pos"], b["dof_pos"])
    np.testing.assert_allclose(b["rewards"], a["rewards"], rtol=1e-5, atol=1e-6)
    for column in ("success", "failure_reason", "length"):
        assert list(eager.episodes[column]) == list(compiled.episodes[column]), column
    np.testing.assert_allclose(compiled.episodes["return"], eager.episodes["return"], rtol=1e-5, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1


def test_a_policy_steering_by_task_terms_is_refused_on_the_locomotion_task(tmp_path, capsys):
    """The reverse of task blindness: the QUARD expert on --task locomotion, whose task terms are zero, would
    write episodes of a robot heading for the origin; refused once the env is built, leaving no store folder."""
    out = tmp_path / "s"
    assert main(["collect", "--store", str(out), "--episodes", "1", *SMALL, "--policy", "quard_expert"]) == 2
    err = capsys.readouterr().err
    assert "leaves at zero" in err and "task_target_pos" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_episodes_a_compaction_quarantines_are_collected_again(tmp_path, capsys):
    """A staged file damaged before this run counts toward the target until compaction sets it aside: the run
    collects again what that leaves missing, and the summary names the quarantined file."""
    out = tmp_path / "store"
    collect(capsys, out, 2)
    (out / "staging" / "main-00000007.episode").write_bytes(b"QFEPISODE1\n not an episode")
    summary = collect(capsys, out, 3)
    assert summary["in_store"] == 3 and summary["collected"] == 1
    assert [p.rsplit("/", 1)[-1] for p in summary["quarantined"]] == ["main-00000007.episode"]
    assert TrajectoryStore.open(out).num_episodes == 3 and validate(out).ok


def test_ctrl_c_says_what_was_kept_and_how_to_go_on(tmp_path, capsys, monkeypatch):
    import quadforge.collection.collect_cmd as collect_cmd

    def interrupted(cfg):
        raise KeyboardInterrupt
    monkeypatch.setattr(collect_cmd, "run_local", interrupted)
    out = tmp_path / "s"
    assert main(["collect", "--store", str(out), "--episodes", "4", *SMALL]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted: the episodes written whole are kept (0 staged")
    assert "run the same command again to resume" in err and f"dataset compact --store {out}" in err
