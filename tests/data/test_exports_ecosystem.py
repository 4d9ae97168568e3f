"""The exports other projects read: robomimic's HDF5 layout and LeRobot v3 (read here with h5py and pyarrow;
tests/data/test_exports_external.py reads them with robomimic's and LeRobot's own loaders)."""
import json

import h5py
import numpy as np
import pytest

from quadforge.data.export import export_hdf5, import_hdf5
from quadforge.data.images import hold_frames
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import SYNTHETIC_INSTRUCTIONS, write_synthetic_image_store
from quadforge.data.validate import validate
from quadforge.terms import PRIVILEGED_TERMS
from quadforge.tools.cli import main

TABLE = list(SYNTHETIC_INSTRUCTIONS)


def image_store(root, n=5):
    return TrajectoryStore.open(write_synthetic_image_store(root, episodes=n))


def held(store, cam, i):
    f0, k = int(store.frame_starts(cam)[i]), int(store.frame_counts(cam)[i])
    t = store.episodes
    return hold_frames(np.asarray(store.array(cam)[f0:f0 + k]), int(t["end"][i] - t["start"][i]), 10)


def test_hdf5_follows_robomimics_layout(tmp_path):
    store = image_store(tmp_path / "s")
    h5 = tmp_path / "x.h5"
    assert main(["dataset", "export-hdf5", "--store", str(store.root), "--output", str(h5)]) == 0
    data = store.load()
    t = store.episodes
    with h5py.File(h5, "r") as f:
        g = f["data"]
        env_args = json.loads(g.attrs["env_args"])
        assert {"env_name", "type", "env_kwargs"} <= set(env_args) and env_args["env_kwargs"]["robot"] == "go1"
        assert g.attrs["total"] == store.num_steps
        assert sorted(g.keys(), key=lambda k: int(k[5:])) == [f"demo_{i}" for i in range(5)]
        for i in range(5):
            d, lo, hi = g[f"demo_{i}"], int(t["start"][i]), int(t["end"][i])
            assert d.attrs["num_samples"] == hi - lo
            assert {"obs", "next_obs", "actions", "rewards", "dones", "states"} <= set(d.keys())
            np.testing.assert_array_equal(d["actions"][()], data["actions"][lo:hi])
            np.testing.assert_array_equal(d["rewards"][()], data["rewards"][lo:hi])
            assert d["dones"][()].tolist() == [0] * (hi - lo - 1) + [1]
            rgb = d["obs/front_rgb"][()]          # one row per step under obs/<key>, not obs/images/
            assert rgb.shape == (hi - lo, 16, 16, 3) and "images" not in d["obs"]
            np.testing.assert_array_equal(rgb, held(store, "images/front_rgb", i))
            np.testing.assert_array_equal(d["next_obs/dof_pos"][:-1], d["obs/dof_pos"][1:])
            np.testing.assert_array_equal(d["next_obs/front_rgb"][-1], rgb[-1])
            terms = json.loads(d["states"].attrs["terms"])
            assert d["states"].shape == (hi - lo, sum(data[k].shape[1] for k in terms))
        train = [n.decode() for n in f["mask/train"][()]]
        valid = [n.decode() for n in f["mask/valid"][()]]
        assert len(valid) == 1 and sorted(train + valid) == sorted(g.keys())
    copy = tmp_path / "copy"                  # and back: the frames taken, every frame_stride-th row
    assert import_hdf5(h5, copy) == 5 and validate(copy).ok
    c = TrajectoryStore.open(copy)
    for k, v in data.items():
        np.testing.assert_array_equal(c.load([k])[k], v)
    np.testing.assert_array_equal(np.asarray(c.array("images/front_rgb")[:]), np.asarray(store.array("images/front_rgb")[:]))
    export_hdf5(copy, tmp_path / "y.h5")
    assert h5.read_bytes() == (tmp_path / "y.h5").read_bytes()


def test_an_export_of_the_first_layout_still_imports(tmp_path):
    """quadforge-robomimic-1 files (frames every frame_stride steps under obs/images/) import as before."""
    store = image_store(tmp_path / "s", n=3)
    h5 = tmp_path / "old.h5"
    export_hdf5(store.root, h5)
    with h5py.File(h5, "r+") as f:           # rewrite into the first layout
        g = f["data"]
        g.attrs["format"] = "quadforge-robomimic-1"
        del g.attrs["cameras"]
        for name in g:
            d = g[name]
            frames = d["obs/front_rgb"][()][::10]
            del d["obs/front_rgb"], d["next_obs"], d["states"]
            d.create_dataset("obs/images/front_rgb", data=frames)
    assert import_hdf5(h5, tmp_path / "copy") == 3
    c = TrajectoryStore.open(tmp_path / "copy")
    np.testing.assert_array_equal(np.asarray(c.array("images/front_rgb")[:]), np.asarray(store.array("images/front_rgb")[:]))


def test_lerobot_v3_layout(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq
    from PIL import Image
    store = image_store(tmp_path / "s")
    out = tmp_path / "lr"
    assert main(["dataset", "export-lerobot", "--store", str(store.root), "--output", str(out)]) == 0
    info = json.loads((out / "meta/info.json").read_text())
    t, data = store.episodes, store.load()
    assert info["codebase_version"] == "v3.0" and info["fps"] == 50
    assert info["total_episodes"] == 5 and info["total_frames"] == store.num_steps and info["total_tasks"] == 2
    assert info["features"]["observation.images.front_rgb"]["dtype"] == "image"
    assert info["quadforge"]["action_feature"] == "hl_commands"
    rows = pq.read_table(out / "data/chunk-000/file-000.parquet").to_pylist()
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    tasks = pq.read_table(out / "meta/tasks.parquet").to_pylist()
    assert [r["task"] for r in tasks] == TABLE and [r["task_index"] for r in tasks] == [0, 1]
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == list(zip(t["start"], t["end"]))
    assert [e["success"] for e in eps] == list(t["success"]) and eps[3]["failure_reason"] == "fall"
    assert [e["tasks"] for e in eps] == [[store.instruction_text(i)] for i in range(5)]
    assert [r["index"] for r in rows] == list(range(store.num_steps))
    np.testing.assert_array_equal(np.asarray([r["action"] for r in rows], np.float32), data["hl_commands"])
    # a one-entry term is a scalar column (LeRobot's shape [1]), inside its vector too; privileged terms (the
    # task's targets, the base height) are in observation.environment_state, never in observation.state
    np.testing.assert_array_equal(np.asarray([r["observation.base_height"] for r in rows], np.float32),
                                  data["base_height"][:, 0])
    state, env_state = (info["features"][k]["names"] for k in ("observation.state", "observation.environment_state"))
    assert "base_height.z" in env_state and not any(n.startswith(("task_", "base_height")) for n in state)
    privileged = [t for t in store.schema.features if t in PRIVILEGED_TERMS]
    assert {n.split(".")[0] for n in env_state} == set(privileged)
    np.testing.assert_array_equal(
        np.asarray([r["observation.environment_state"] for r in rows], np.float32).reshape(len(rows), -1),
        np.concatenate([data[t].reshape(len(rows), -1) for t in privileged], axis=1))
    for i in range(5):
        lo, hi = int(t["start"][i]), int(t["end"][i])
        frames = np.stack([np.asarray(Image.open(io.BytesIO(r["observation.images.front_rgb"]["bytes"])))
                           for r in rows[lo:hi]])
        np.testing.assert_array_equal(frames, held(store, "images/front_rgb", i))   # lossless PNG
        assert [r["next.done"] for r in rows[lo:hi]] == [False] * (hi - lo - 1) + [True]
        assert {r["task_index"] for r in rows[lo:hi]} == {i % 2}
    stats = json.loads((out / "meta/stats.json").read_text())
    np.testing.assert_allclose(stats["action"]["mean"], data["hl_commands"].mean(0), rtol=1e-5, atol=1e-6)
    assert np.shape(stats["observation.images.front_rgb"]["mean"]) == (3, 1, 1)
    assert main(["dataset", "export-lerobot", "--store", str(store.root), "--output", str(out)]) == 2  # not empty
    assert "holds an earlier LeRobot export" in capsys.readouterr().err
    assert main(["dataset", "export-lerobot", "--store", str(store.root), "--output", str(tmp_path / "j"),
                 "--action", "joint"]) == 0
    assert json.loads((tmp_path / "j/meta/info.json").read_text())["quadforge"]["action_feature"] == "actions"
    del pa


def test_a_failed_lerobot_export_leaves_no_half_dataset(tmp_path, capsys, monkeypatch):
    """A full disk mid-export: one line, and the folder the export made is gone (a rerun into it would
    otherwise be refused as a non-empty folder that is not a LeRobot dataset)."""
    import errno
    import os

    import quadforge.data.export_lerobot as export_lerobot
    pytest.importorskip("pyarrow")
    store = image_store(tmp_path / "s")
    rows = export_lerobot._episode_rows

    def fills_up(store, layout, data, i, *args):
        if i == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return rows(store, layout, data, i, *args)
    monkeypatch.setattr(export_lerobot, "_episode_rows", fills_up)
    out = tmp_path / "lr"
    assert main(["dataset", "export-lerobot", "--store", str(store.root), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device (ENOSPC); nothing was written" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    monkeypatch.undo()
    assert main(["dataset", "export-lerobot", "--store", str(store.root), "--output", str(out)]) == 0


def test_another_image_rate_is_refused_before_the_work(tmp_path, capsys):
    """One image rate per store: a collection or an import at another --frame-stride was quarantined whole
    after the work; it is refused up front now, naming both rates."""
    store = image_store(tmp_path / "s")   # a frame every 10 steps
    other = write_synthetic_image_store(tmp_path / "o", episodes=2, stride=5)
    export_hdf5(other, tmp_path / "o.h5")
    assert main(["dataset", "import-hdf5", "--input", str(tmp_path / "o.h5"), "--store", str(store.root)]) == 2
    err = capsys.readouterr().err
    assert "records a camera frame every 10 steps" in err and "one every 5" in err
    assert main(["collect", "--store", str(store.root), "--episodes", "9", "--task", "quard:go_to",
                 "--frame-stride", "20"]) == 2
    assert "--frame-stride asks for one every 20" in capsys.readouterr().err
    assert TrajectoryStore.open(store.root).num_episodes == 5 and not (store.root / "quarantine").exists()
