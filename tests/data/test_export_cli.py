import json

import h5py
import numpy as np

from quadforge.data.compaction import compact
from quadforge.data.export import export_hdf5, import_hdf5
from quadforge.data.writer import StagingWriter
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_info
from quadforge.data.validate import validate
from quadforge.tools.cli import main


def _h5_contents(path):
    """Every dataset's bytes + dtype and every attribute, by path."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in obj.attrs.items()}
            if isinstance(obj, h5py.Dataset):
                out[name] = (str(obj.dtype), obj.shape, obj[()].tobytes(), attrs)
            else:
                out[name] = attrs
        f.visititems(visit)
        out["/"] = {k: v for k, v in f["data"].attrs.items()}
    return out


def test_hdf5_roundtrip_is_bit_identical(tmp_path, write_episodes):
    store = tmp_path / "s"
    # two collectors compacted in two generations: store order != id order
    a = write_episodes(store, "c1", n=3, seed=0)
    compact(store)
    rng = np.random.default_rng(5)
    w = StagingWriter(store, "c0")
    feats = synthetic_episode(rng, 12, True)
    w.write_episode(feats, {**synthetic_info(0, True), "instruction": "walk forward", "note": "x"})
    compact(store)
    h5a, h5b = tmp_path / "a.h5", tmp_path / "b.h5"
    assert export_hdf5(store, h5a) == 4
    with h5py.File(h5a, "r") as f:
        d = f["data/demo_3"]
        np.testing.assert_array_equal(d["obs/dof_pos"][()], feats["dof_pos"])
        np.testing.assert_array_equal(d["actions"][()], feats["actions"])
        assert d["dones"][()].tolist() == [0] * 11 + [1]
        assert d.attrs["episode_id"] == "c0-00000000" and d.attrs["terrain_type"] == "flat"
        assert json.loads(d.attrs["extra"]) == {"note": "x"}
        assert [n.decode() for n in f["mask/success"][()]] == ["demo_0", "demo_1", "demo_3"]
        assert [n.decode() for n in f["mask/failure"][()]] == ["demo_2"]
        assert [n.decode() for n in f["mask/terrain_flat"][()]] == ["demo_0", "demo_3"]
    copy = tmp_path / "copy"
    assert import_hdf5(h5a, copy) == 4
    assert validate(copy).ok
    original, imported = TrajectoryStore.open(store), TrajectoryStore.open(copy)
    assert imported.episode_ids == original.episode_ids
    for k, v in original.load().items():
        np.testing.assert_array_equal(imported.load([k])[k], v)
    export_hdf5(copy, h5b)
    assert _h5_contents(h5a) == _h5_contents(h5b)
    assert h5a.read_bytes() == h5b.read_bytes()
    assert import_hdf5(h5a, copy) == 0  # already there: nothing duplicated


def test_dataset_info_json(tmp_path, write_episodes, capsys):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=6, seed=1)
    assert main(["dataset", "compact", "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(["dataset", "info", "--store", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["episodes"] == 6 and info["generation"] == 1 and info["robot"] == "go1"
    assert info["steps"] == TrajectoryStore.open(store).num_steps
    assert info["success_rate"] == 4 / 6
    assert info["terrains"]["gaps"] == {"episodes": 2, "success_rate": 0.0}
    assert info["failure_reasons"] == {"none": 4, "fall": 2}
    assert info["features"]["dof_pos"] == {"dtype": "float32", "shape": [12]}
    assert info["control_rate_hz"] == 50.0 and info["staged"] == 0
    assert main(["dataset", "validate", "--store", str(store)]) == 0
    assert main(["dataset", "info", "--store", str(tmp_path / "missing")]) == 2
    assert "no such trajectory store" in capsys.readouterr().err
    (store / "manifest.json").unlink()
    assert main(["dataset", "validate", "--store", str(store)]) == 1
    assert "missing manifest" in capsys.readouterr().out


def test_export_and_import_hdf5_old_positional_spellings(tmp_path, write_episodes, capsys):
    """`dataset export-hdf5 STORE OUT.h5` and `import-hdf5 IN.h5 STORE` (the spellings before --store/--output)
    still work beside the flags, with a deprecation warning; mixed with a flag, a positional fills the rest."""
    store = tmp_path / "s"
    write_episodes(store, "c0", n=3, seed=2)
    compact(store)
    old, new, mixed = tmp_path / "old.h5", tmp_path / "new.h5", tmp_path / "mixed.h5"
    assert main(["dataset", "export-hdf5", str(store), str(old)]) == 0
    out = capsys.readouterr()
    assert "deprecated" in out.err and "--store" in out.err and "--output" in out.err
    assert f"wrote 3 demos to {old}" in out.out
    assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(new)]) == 0
    assert main(["dataset", "export-hdf5", "--store", str(store), str(mixed)]) == 0
    assert old.read_bytes() == new.read_bytes() == mixed.read_bytes()
    capsys.readouterr()
    assert main(["dataset", "import-hdf5", str(old), str(tmp_path / "copy")]) == 0
    assert TrajectoryStore.open(tmp_path / "copy").num_episodes == 3
    assert main(["dataset", "export-hdf5", "--store", str(store)]) == 2
    assert "--output is required" in capsys.readouterr().err
    assert main(["dataset", "export-hdf5", str(store), str(old), "extra"]) == 2
    assert "unexpected argument(s) ['extra']" in capsys.readouterr().err


def _files(root):
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_compact_refuses_a_folder_that_is_not_a_store(tmp_path, write_episodes, capsys):
    other = tmp_path / "otherdir"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, holds in ((other, "it holds notes.txt"), (empty, "it is empty")):
        assert main(["dataset", "compact", "--store", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--store {folder}" in err and "not a trajectory store" in err, err
        assert holds in err, err
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"] and not any(empty.iterdir())   # no .lock
    assert (other / "notes.txt").read_text() == "mine\n"
    store = tmp_path / "s"   # a store with staged episodes only (a collection before its first compaction)
    write_episodes(store, "c0", n=2, seed=3)
    assert main(["dataset", "compact", "--store", str(store)]) == 0
    assert TrajectoryStore.open(store).num_episodes == 2


def test_dataset_paths_of_the_wrong_kind_say_what_they_are(tmp_path, write_episodes, capsys):
    store = tmp_path / "s1"
    write_episodes(store, "c0", n=2, seed=4)
    compact(store)
    h5 = tmp_path / "ex1.h5"
    export_hdf5(store, h5)
    before = {**_files(store), str(h5): h5.read_bytes()}
    for action in ("info", "validate", "compact", "export-lerobot"):
        assert main(["dataset", action, "--store", str(h5), "--output", str(tmp_path / "x")]
                    if action == "export-lerobot" else ["dataset", action, "--store", str(h5)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"--store {h5}: is a file, not a trajectory store folder" in err and len(err.splitlines()) == 1, err
    assert main(["dataset", "import-hdf5", "--input", str(store), "--store", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"import-hdf5 --input {store}: is a folder, not an HDF5 file" in err and len(err.splitlines()) == 1, err
    assert {**_files(store), str(h5): h5.read_bytes()} == before
    assert not (tmp_path / "new").exists() and not (tmp_path / "x").exists()
