import json
import os
import re

import numpy as np
import pytest

import quadforge.data.compaction as compaction
from quadforge.data.compaction import store_lock
from quadforge.data.samplers import EpisodeArrays, WindowSampler
from quadforge.data.staging import list_staged
from quadforge.data.writer import StagingWriter
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.validate import validate
from quadforge.layout import JOINT_NAMES, get_layout


def _concat(episodes, name):
    return np.concatenate([f[name] for _, f, _ in episodes])


def test_roundtrip_write_compact_open_load(tmp_path, small_chunks, write_episodes):
    store = tmp_path / "s"
    first = write_episodes(store, "c0", n=4, seed=0)
    r1 = compact(store)
    assert r1.generation == 1 and r1.appended == [e[0] for e in first] and not list_staged(store)
    second = write_episodes(store, "c1", n=3, seed=1)  # appends into a partially filled chunk
    r2 = compact(store)
    assert r2.generation == 2
    s = TrajectoryStore.open(store)
    everything = first + second
    assert s.num_episodes == 7 and s.num_steps == sum(len(f["actions"]) for _, f, _ in everything)
    assert s.episode_ids == [e[0] for e in everything]
    loaded = s.load()
    for name in everything[0][1]:
        assert loaded[name].dtype == everything[0][1][name].dtype
        np.testing.assert_array_equal(loaded[name], _concat(everything, name))
    assert s.group["data/actions"].chunks[0] < s.num_steps  # really spans several chunks
    # stats maintained incrementally equal a recomputation
    acts = _concat(everything, "actions").astype(np.float64)
    np.testing.assert_allclose(s.stats["actions"]["mean"], acts.mean(0), rtol=1e-6, atol=1e-7)  # float32 pairwise sums
    np.testing.assert_allclose(s.stats["actions"]["std"], acts.std(0), rtol=1e-6)
    np.testing.assert_array_equal(s.stats["actions"]["max"], acts.max(0))
    assert validate(store).ok, validate(store).text()


def test_episode_table_and_schema(tmp_path, write_episodes):
    store = tmp_path / "s"
    eps = write_episodes(store, "robotA", n=3, seed=2)
    compact(store)
    s = TrajectoryStore.open(store)
    t = s.episodes
    lengths = [len(f["actions"]) for _, f, _ in eps]
    assert t["length"].tolist() == lengths
    assert t["start"].tolist() == [0, lengths[0], lengths[0] + lengths[1]]
    assert t["end"].tolist() == np.cumsum(lengths).tolist()
    assert t["success"].tolist() == [True, True, False]
    assert t["terminated"].tolist() == [False, False, True]
    assert t["failure_reason"].tolist() == ["none", "none", "fall"]
    assert t["terrain_type"].tolist() == ["flat", "stairs_up", "gaps"]
    assert t["terrain_level"].tolist() == [0, 1, 2]
    assert t["collector_id"].tolist() == ["robotA"] * 3 and t["policy_id"][0] == "gait:trot"
    assert t["seed"].tolist() == [0, 1, 2] and t["gait"][0] == "trot"
    np.testing.assert_allclose(t["return"], [f["rewards"].astype(np.float64).sum() for _, f, _ in eps])
    np.testing.assert_allclose(t["cmd_vx"], [f["commands"][:, 0].mean() for _, f, _ in eps], rtol=1e-6)
    assert t["label"][2] == {"distance_ratio": 0.2}
    assert t.select({"success_only": True, "terrain_types": ["stairs_up", "gaps"]}).tolist() == [1]
    assert s.schema.robot == "go1" and s.schema.control_rate_hz == 50.0
    assert s.schema.features["dof_pos"].names == JOINT_NAMES and s.schema.features["dof_pos"].units.startswith("rad")
    # the sampler reads the store directly
    w = WindowSampler(s, get_layout("proprio"), context=8, split="all", filters={"terrain_types": ["gaps"]})
    assert w.episode_indices.tolist() == [2] and w.sample(4)["obs"].shape == (4, 8, get_layout("proprio").dim)
    arrays = EpisodeArrays.from_store(s, ["actions"])
    assert arrays.num_episodes == 3 and arrays.episode_info["episode_id"][0] == "robotA-00000000"


def test_resume_ids_include_staged_and_stored(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=2)
    compact(store)
    write_episodes(store, "c0", n=1, seed=3)  # resumes at 2, staged only
    assert TrajectoryStore.existing_episode_ids(store) == {"c0-00000000", "c0-00000001", "c0-00000002"}
    assert StagingWriter(store, "c0").next_episode_id() == "c0-00000003"
    assert StagingWriter(store, "c1").next_episode_id() == "c1-00000000"
    compact(store)
    assert TrajectoryStore.open(store).episode_ids == ["c0-00000000", "c0-00000001", "c0-00000002"]


def test_crash_between_append_and_manifest(tmp_path, small_chunks, write_episodes, monkeypatch):
    store = tmp_path / "s"
    first = write_episodes(store, "c0", n=2, seed=0)
    compact(store)
    second = write_episodes(store, "c0", n=3, seed=1)

    def crash(*a, **k):
        raise RuntimeError("simulated crash")
    monkeypatch.setattr(compaction, "write_manifest", crash)
    with pytest.raises(RuntimeError):
        compact(store)
    monkeypatch.undo()
    s = TrajectoryStore.open(store)  # the previous generation, extra rows ignored
    assert s.generation == 1 and s.num_episodes == 2
    assert s.group["data/actions"].shape[0] > s.num_steps  # the orphan rows really are on disk
    assert validate(store).ok
    np.testing.assert_array_equal(s.load(["actions"])["actions"], _concat(first, "actions"))
    r = compact(store)  # completes the interrupted work
    s = TrajectoryStore.open(store)
    assert r.generation == 2 and s.episode_ids == [e[0] for e in first + second]
    np.testing.assert_array_equal(s.load(["dof_pos"])["dof_pos"], _concat(first + second, "dof_pos"))
    assert validate(store).ok


def test_crash_after_manifest_before_staging_cleanup(tmp_path, write_episodes, monkeypatch):
    store = tmp_path / "s"
    eps = write_episodes(store, "c0", n=3)
    monkeypatch.setattr(compaction, "_delete", lambda paths, root: (_ for _ in ()).throw(RuntimeError("crash")))
    with pytest.raises(RuntimeError):
        compact(store)
    monkeypatch.undo()
    assert len(list_staged(store)) == 3 and TrajectoryStore.open(store).num_episodes == 3
    r = compact(store)
    assert r.skipped == [e[0] for e in eps] and not r.appended and not list_staged(store)
    s = TrajectoryStore.open(store)
    assert s.num_episodes == 3 and len(set(s.episode_ids)) == 3


def test_missing_and_corrupt_manifest(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=2)
    with pytest.raises(FileNotFoundError, match="manifest"):
        TrajectoryStore.open(store)  # staged but never compacted
    compact(store)
    (store / "manifest.json").write_text('{"generation": 1, "num_st')
    with pytest.raises(ValueError, match="corrupt manifest"):
        TrajectoryStore.open(store)
    with pytest.raises(FileNotFoundError, match="no such"):
        TrajectoryStore.open(tmp_path / "nope")


def test_truncated_chunk_is_a_clear_error(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=2)
    compact(store)
    chunk = store / "data" / "dof_vel" / "c" / "0" / "0"
    raw = chunk.read_bytes()
    chunk.write_bytes(raw[: len(raw) // 2])
    s = TrajectoryStore.open(store)
    with pytest.raises(ValueError, match="dof_vel.*unreadable"):
        s.load(["dof_vel"])
    rep = validate(store)
    assert not rep.ok and any("dof_vel" in p and "cannot be decoded" in p for p in rep.problems)


def test_schema_mismatch_names_file_feature_expected_found(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=1)
    compact(store)
    rng = np.random.default_rng(0)
    w = StagingWriter(store, "c9")
    feats = {k: v for k, v in write_episodes(tmp_path / "other", n=1)[0][1].items() if k != "gait_clock"}
    w.write_episode(feats, {"success": True})
    w.close()
    # the file cannot join the store: set aside with its reason, the store is not blocked
    r = compact(store)
    assert r.appended == [] and len(r.quarantined) == 1 and not list_staged(store)
    reason = (store / "quarantine" / "c9-00000000.episode.reason.txt").read_text()
    assert re.search(r"c9-00000000\.episode.*missing \['gait_clock'\]", reason)
    assert TrajectoryStore.open(store).num_episodes == 1  # nothing was written
    # a dtype change (written without the writer's casting)
    full = write_episodes(tmp_path / "other2", n=1)[0][1]
    full["rewards"] = full["rewards"].astype(np.float64)
    from quadforge.data.staging import write_episode_file  # unvalidated, as a foreign writer might
    write_episode_file(store / "staging" / "c8-00000000.episode", full,
                       {"episode_id": "c8-00000000", "collector_id": "c8"})
    assert len(compact(store).quarantined) == 1
    reason = (store / "quarantine" / "c8-00000000.episode.reason.txt").read_text()
    assert re.search(r"c8-00000000\.episode.*'rewards'.*expected dtype float32, found float64", reason)
    w = StagingWriter(store, "c9")
    with pytest.raises(ValueError, match="unknown feature 'dof_posz'"):
        w.write_episode({"dof_posz": np.zeros((3, 12))}, {})
    with pytest.raises(ValueError, match="'dof_pos' has per-step shape"):
        w.write_episode({"dof_pos": np.zeros((3, 11))}, {})


def test_validate_lists_every_broken_invariant(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=4)
    compact(store)
    table_file, = TrajectoryStore.open(store).table_files
    table = json.loads(table_file.read_text())
    cols = table["columns"]
    cols["start"][2] += 1                        # starts no longer contiguous, length != end - start
    cols["episode_id"][3] = cols["episode_id"][0]  # duplicate id
    table_file.write_text(json.dumps(table))
    manifest = json.loads((store / "manifest.json").read_text())
    del manifest["stats"]["dof_vel"]             # stats missing
    (store / "manifest.json").write_text(json.dumps(manifest))
    for p in (store / "data" / "actions" / "c").rglob("*"):  # a lost chunk
        if p.is_file():
            p.unlink()
    import zarr                                  # a non-finite value, written behind the store's back
    zarr.open_group(str(store), mode="a", zarr_format=3)["data/rewards"][1] = np.nan
    rep = validate(store)
    text = "\n".join(rep.problems)
    assert "starts not contiguous" in text and "length != end - start" in text
    assert "duplicate episode ids" in text and "no stats for feature 'dof_vel'" in text
    assert "data/actions: chunk(s) [0] missing" in text and "data/rewards: 1 step(s) with non-finite" in text
    assert "episode table differs from the one the manifest committed" in text   # and still checked, above
    assert len(rep.problems) >= 7


def test_lock_excludes_a_second_compactor(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=1)
    with store_lock(store):
        with pytest.raises(TimeoutError, match="lock"):
            compact(store, lock_timeout=0.2)
    assert compact(store).generation == 1


def test_staging_file_roundtrip_and_damage(tmp_path):
    from quadforge.data.staging import read_staged, read_staged_header, write_staging_file
    rng = np.random.default_rng(0)
    feats = {"dof_pos": rng.normal(size=(7, 12)), "terminated": np.arange(7) == 6,
             "images/front": rng.integers(0, 255, size=(7, 8, 6, 3)).astype(np.uint8)}
    path = write_staging_file(tmp_path, "cam-00000003", "cam", feats, {"success": np.bool_(True), "x": np.float32(2)})
    assert path.name == "cam-00000003.episode"
    heads, info = read_staged_header(path)
    assert heads["dof_pos"] == ((7, 12), np.dtype("float32")) and heads["images/front"][0] == (7, 8, 6, 3)
    data, info2 = read_staged(path)
    assert info == info2 and info["success"] is True and info["length"] == 7 and info["episode_id"] == "cam-00000003"
    np.testing.assert_array_equal(data["dof_pos"], feats["dof_pos"].astype(np.float32))
    np.testing.assert_array_equal(data["terminated"], feats["terminated"])
    np.testing.assert_array_equal(data["images/front"], feats["images/front"])
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 200])
    with pytest.raises(ValueError, match=r"cam-00000003\.episode: truncated data"):
        read_staged(path)
    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="bad magic"):
        read_staged_header(path)


def test_one_robot_and_rate_per_store(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=1)
    compact(store)
    eid, feats, info = write_episodes(tmp_path / "o", n=1)[0]
    StagingWriter(store, "c5").write_episode(feats, {**info, "robot": "aliengo"})
    r = compact(store)
    assert r.appended == [] and r.quarantined
    assert "c5-00000000.episode: robot 'aliengo', the store holds 'go1'" in \
        (store / "quarantine" / "c5-00000000.episode.reason.txt").read_text()
    # reported by validate (a warning: the store itself is sound) and by info; later collections proceed
    rep = validate(store)
    assert rep.ok and any("quarantined staging file c5-00000000.episode" in w for w in rep.warnings)
    from quadforge.data.cli import summary
    assert summary(store)["quarantined"][0]["reason"].endswith("(one robot per store)")
    write_episodes(store, "c6", n=1)
    assert compact(store).appended == ["c6-00000000"]


def test_images_live_in_their_own_group(tmp_path, small_chunks):
    store = tmp_path / "s"
    rng = np.random.default_rng(1)
    w = StagingWriter(store, "cam")
    frames = []
    for length in (5, 9):
        f = rng.integers(0, 255, size=(length, 6, 8, 3), dtype=np.uint8)
        frames.append(f)
        w.write_episode({"images/front": f, "dof_pos": rng.normal(size=(length, 12)), "rewards": np.ones(length)},
                        {"success": True, "robot": "go1"})
    compact(store)
    s = TrajectoryStore.open(store)
    assert (store / "images" / "front" / "zarr.json").is_file() and "images/front" not in s.stats
    np.testing.assert_array_equal(s.load(["images/front"])["images/front"], np.concatenate(frames))
    assert s.schema.features["images/front"].shape == (6, 8, 3)
    assert validate(store).ok, validate(store).text()
    from quadforge.data.export import export_hdf5, import_hdf5
    export_hdf5(store, tmp_path / "cam.h5")
    import_hdf5(tmp_path / "cam.h5", tmp_path / "copy")
    copy = TrajectoryStore.open(tmp_path / "copy")
    np.testing.assert_array_equal(copy.load(["images/front"])["images/front"], np.concatenate(frames))


def test_truncated_array_is_a_clear_error(tmp_path, write_episodes):
    store = tmp_path / "s"
    write_episodes(store, n=2)
    compact(store)
    import zarr
    arr = zarr.open_group(str(store), mode="a", zarr_format=3)["data/dof_pos"]
    arr.resize((3, 12))
    with pytest.raises(ValueError, match=r"data/dof_pos: truncated: 3 steps on disk, the manifest says"):
        TrajectoryStore.open(store)
    assert any("data/dof_pos: 3 rows on disk" in p for p in validate(store).problems)
