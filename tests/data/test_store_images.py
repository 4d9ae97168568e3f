"""Image episodes in the store: frames at their own rate, instruction table, task parameters."""
import json

import h5py
import numpy as np
import pytest

import quadforge.data.compaction as compaction
from quadforge.data.cli import summary
from quadforge.data.export import export_hdf5, import_hdf5
from quadforge.data.images import frame_starts, frame_steps, num_frames
from quadforge.data.staging import list_quarantined, list_staged
from quadforge.data.writer import StagingWriter
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_image_episode, synthetic_info, synthetic_task_params
from quadforge.envs.quard.families import family_names
from quadforge.data.validate import validate

ENV_TABLE = ["go to the red cube, slowly with a trotting gait", "stop the blue ball, quickly with a pacing gait",
             "distinguish letter c, normally with a trotting gait"]


@pytest.fixture
def small_image_chunks(monkeypatch):
    """A few frames per image chunk and a few steps per step chunk: tiny stores cross chunk boundaries."""
    import quadforge.data.images as images
    monkeypatch.setattr(images, "IMAGE_CHUNK_BYTES", 1)
    monkeypatch.setattr(images, "MIN_IMAGE_CHUNK_FRAMES", 4)
    monkeypatch.setattr(compaction, "TARGET_CHUNK_BYTES", 256)


def write_image_episodes(store, collector="cam", n=4, seed=0, stride=10, depth=True, table=ENV_TABLE,
                         lengths=None, size=16):
    rng = np.random.default_rng(seed)
    w = StagingWriter(store, collector)
    out = []
    for i in range(n):
        length = int(lengths[i]) if lengths is not None else int(rng.integers(15, 60))
        success = i % 4 != 3
        k = (i + seed) % len(table)
        feats = synthetic_image_episode(rng, length, success, stride=stride, size=size, depth=depth,
                                        instruction_index=k)
        params = synthetic_task_params(i, seed, families=family_names())
        info = {**synthetic_info(i, success), "task": f"quard:{params['family']}", "task_params": params,
                "instruction": table[k], "instructions": {str(k): table[k]}, "frame_stride": stride}
        out.append((w.write_episode(feats, info), feats, info))
    return out


def test_images_roundtrip_at_their_own_rate(tmp_path, small_image_chunks):
    store = tmp_path / "s"
    first = write_image_episodes(store, n=3, seed=0)
    compact(store)
    second = write_image_episodes(store, "cam2", n=3, seed=1)   # appends into partly filled image chunks
    compact(store)
    s = TrajectoryStore.open(store)
    everything = first + second
    lengths = np.array([len(f["actions"]) for _, f, _ in everything])
    assert s.num_steps == lengths.sum() and s.schema.frame_stride == 10
    assert s.schema.to_dict()["images"]["frame_rate_hz"] == pytest.approx(5.0)
    rgb = s.load(["images/front_rgb"])["images/front_rgb"]
    assert rgb.dtype == np.uint8 and len(rgb) == num_frames(lengths, 10).sum() == s.manifest["lengths"]["images/front_rgb"]
    np.testing.assert_array_equal(rgb, np.concatenate([f["images/front_rgb"] for _, f, _ in everything]))
    depth = s.load(["images/front_depth"])["images/front_depth"]
    assert depth.dtype == np.float32 and depth.shape[1:] == (16, 16)
    # the frame <-> step mapping: episode e's frame j is its step j * stride
    np.testing.assert_array_equal(s.frame_starts("images/front_rgb"), frame_starts(lengths, 10))
    assert frame_steps(25, 10).tolist() == [0, 10, 20]
    e = 4
    f0 = s.frame_starts("images/front_rgb")[e]
    np.testing.assert_array_equal(rgb[f0:f0 + s.frame_counts("images/front_rgb")[e]],
                                  everything[e][1]["images/front_rgb"])
    assert s.array("images/front_rgb").chunks[0] < len(rgb)   # really several image chunks
    # task parameters and the instruction table
    assert s.task_params(2) == everything[2][2]["task_params"]
    assert s.instruction_text(2) == everything[2][2]["instruction"]
    assert s.episodes.select({"families": ["stop"]}).tolist() == [2, 5]
    per_step = s.load(["instruction"])["instruction"]
    texts = [s.instructions[k] for k in per_step[s.episodes["start"]]]
    assert texts == [info["instruction"] for _, _, info in everything]
    assert "images/front_rgb" not in s.stats and "instruction" in s.stats
    rep = validate(store)
    assert rep.ok, rep.text()
    info = summary(store)
    im = info["images"]["images/front_rgb"]
    assert im["frames"] == len(rgb) and im["frame_rate_hz"] == 5.0 and 0 < im["bytes_per_frame_on_disk"]
    assert info["instructions"] == len(s.instructions) and info["families"]["stop"]["episodes"] == 2


def test_stride_is_honoured_and_checked(tmp_path):
    store = tmp_path / "s"
    rng = np.random.default_rng(0)
    w = StagingWriter(store, "cam")
    feats = synthetic_image_episode(rng, 21, True, stride=10, size=8)
    assert len(feats["images/front_rgb"]) == 3                       # steps 0, 10, 20
    info = {**synthetic_info(0, True), "instructions": {"0": "go"}}
    with pytest.raises(ValueError, match=r"ceil\(21 steps / frame_stride 5\) = 5 frames; got \{'images/front_rgb': 3\}"):
        w.write_episode(feats, {**info, "frame_stride": 5})
    with pytest.raises(ValueError, match="frame_stride=0"):
        w.write_episode(feats, {**info, "frame_stride": 0})
    with pytest.raises(ValueError, match=r"per-step instruction indices \[0\] have no text"):
        w.write_episode(feats, {**synthetic_info(0, True), "frame_stride": 10})
    w.write_episode(feats, {**info, "frame_stride": 10})
    compact(store)
    other = synthetic_image_episode(rng, 20, True, stride=4, size=8)
    w.write_episode(other, {**info, "frame_stride": 4})
    r = compact(store)                       # set aside with its reason; the store is untouched
    assert r.appended == [] and len(r.quarantined) == 1 and not list_staged(store)
    assert "frame_stride 4, the store records images every 10 steps" in list_quarantined(store)[0][1]
    assert TrajectoryStore.open(store).num_episodes == 1
    with pytest.raises(ValueError, match="float32 depth"):
        w.write_episode({**other, "images/front_rgb": np.zeros((5, 8, 8, 2), np.uint8)},
                        {**info, "frame_stride": 4})


def test_instruction_indices_follow_the_store_table(tmp_path):
    """Collectors with different env tables share one store table; per-step indices are rewritten."""
    store = tmp_path / "s"
    write_image_episodes(store, "a", n=3, seed=0, depth=False)
    write_image_episodes(store, "b", n=3, seed=0, depth=False, table=list(reversed(ENV_TABLE)) + ["go through"])
    compact(store)
    s = TrajectoryStore.open(store)
    per_step = s.load(["instruction"])["instruction"]
    firsts = per_step[s.episodes["start"]]
    assert [s.instructions[k] for k in firsts] == [s.instruction_text(i) for i in range(6)]
    assert len(set(s.instructions)) == len(s.instructions)
    # compaction checks again what the writer checks (a staging file written by other code)
    from quadforge.data.staging import write_episode_file
    feats = synthetic_image_episode(np.random.default_rng(3), 12, True, size=16, depth=False, instruction_index=7)
    info = {**synthetic_info(0, True), "frame_stride": 10, "instructions": {"1": "x"}, "episode_id": "c-00000000",
            "collector_id": "c", "length": 12}
    write_episode_file(store / "staging" / "c-00000000.episode", feats, info)
    assert len(compact(store).quarantined) == 1
    assert "c-00000000.episode: per-step instruction indices [7] have no text" in list_quarantined(store)[0][1]


def test_crash_before_manifest_keeps_images_consistent_and_resumes(tmp_path, small_image_chunks, monkeypatch):
    store = tmp_path / "s"
    first = write_image_episodes(store, n=2, seed=0)
    compact(store)
    before = TrajectoryStore.open(store).load(["images/front_rgb"])["images/front_rgb"]
    second = write_image_episodes(store, n=2, seed=5)

    def boom(*a, **k):
        raise RuntimeError("killed before the commit")
    monkeypatch.setattr(compaction, "write_manifest", boom)
    with pytest.raises(RuntimeError):
        compact(store)
    monkeypatch.undo()
    s = TrajectoryStore.open(store)
    assert s.num_episodes == 2 and len(s.instructions) == 2
    np.testing.assert_array_equal(s.load(["images/front_rgb"])["images/front_rgb"], before)
    assert validate(store).ok
    # the resumed writer continues after the staged ids; compaction appends everything once
    more = write_image_episodes(store, n=1, seed=9)
    assert more[0][0] == "cam-00000004"
    compact(store)
    s = TrajectoryStore.open(store)
    assert s.episode_ids == [e[0] for e in first + second + more]
    np.testing.assert_array_equal(s.load(["images/front_rgb"])["images/front_rgb"],
                                  np.concatenate([f["images/front_rgb"] for _, f, _ in first + second + more]))
    assert validate(store).ok, validate(store).text()


def test_validate_reports_image_problems(tmp_path, small_image_chunks):
    store = tmp_path / "s"
    write_image_episodes(store, n=3, seed=0)
    compact(store)
    chunk = store / "images" / "front_rgb" / "c" / "1" / "0" / "0" / "0"
    assert chunk.is_file()
    chunk.unlink()
    m = json.loads((store / "manifest.json").read_text())
    m["lengths"]["images/front_depth"] += 1
    (store / "manifest.json").write_text(json.dumps(m))
    problems = validate(store).problems
    assert any("images/front_rgb: chunk(s) [1] missing" in p for p in problems), problems
    assert any("'images/front_depth' length" in p and "frames" in p for p in problems), problems


def test_store_without_images_is_unchanged(tmp_path, as_format_1):
    store = tmp_path / "s"
    rng = np.random.default_rng(0)
    StagingWriter(store, "c").write_episode(synthetic_episode(rng, 10, True), synthetic_info(0, True))
    compact(store)
    schema = json.loads((store / "meta" / "schema.json").read_text())
    assert "images" not in schema and not any("stride" in f for f in schema["features"].values())
    assert not (store / "meta" / "instructions.json").exists()
    s = TrajectoryStore.open(store)
    assert s.instructions == [] and s.task_params(0) == {} and s.image_features == ()
    assert "images" not in summary(store)
    # a table written before instruction_id/task_params existed (by the code before table segments) still reads
    as_format_1(store)
    table_file, = TrajectoryStore.open(store).table_files
    t = json.loads(table_file.read_text())
    del t["columns"]["instruction_id"], t["columns"]["task_params"]
    table_file.write_text(json.dumps(t))
    assert TrajectoryStore.open(store).episodes["instruction_id"].tolist() == [-1] and validate(store).ok


def test_hdf5_roundtrip_with_images(tmp_path, small_image_chunks):
    store = tmp_path / "s"
    write_image_episodes(store, "b", n=3, seed=0)
    compact(store)
    write_image_episodes(store, "a", n=2, seed=1, table=["go through the red tunnel"] + ENV_TABLE)
    compact(store)
    h5a, h5b = tmp_path / "a.h5", tmp_path / "b.h5"
    assert export_hdf5(store, h5a) == 5
    s = TrajectoryStore.open(store)
    with h5py.File(h5a, "r") as f:
        d = f["data/demo_1"]
        # robomimic's layout: one row per step under obs/<camera>, the frames taken every frame_stride-th row
        assert d["obs/front_rgb"].shape[0] == d.attrs["num_samples"]
        f0, k = s.frame_starts("images/front_rgb")[1], s.frame_counts("images/front_rgb")[1]
        np.testing.assert_array_equal(d["obs/front_rgb"][::10], s.array("images/front_rgb")[f0:f0 + k])
        assert d.attrs["frame_stride"] == 10
        assert json.loads(d.attrs["task_params"]) == s.task_params(1)
        assert json.loads(f["data"].attrs["instructions"]) == s.instructions
    copy = tmp_path / "copy"
    assert import_hdf5(h5a, copy) == 5
    c = TrajectoryStore.open(copy)
    assert c.instructions == s.instructions and validate(copy).ok
    for k, v in s.load().items():
        np.testing.assert_array_equal(c.load([k])[k], v)
    assert [c.task_params(i) for i in range(5)] == [s.task_params(i) for i in range(5)]
    export_hdf5(copy, h5b)
    assert h5a.read_bytes() == h5b.read_bytes()
    assert export_hdf5(copy, h5b) == 5          # replacing an existing export is fine


def test_a_damaged_instruction_table_is_caught(tmp_path):
    store = tmp_path / "s"
    write_image_episodes(store, n=2, seed=0, depth=False)
    compact(store)
    path = store / "meta" / "instructions.json"
    table = json.loads(path.read_text())
    table["instructions"][0] = "go to the blue cube"          # same length, other text
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="instructions.json: instruction table differs from the one the manifest"):
        TrajectoryStore.open(store)
    assert any("instructions.json" in p for p in validate(store).problems)
