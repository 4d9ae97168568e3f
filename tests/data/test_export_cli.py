import errno
import json
import os

import h5py
import numpy as np
import pytest

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
    assert main(["dataset", "info", "--store", str(store), "--json", str(tmp_path / "i.json")]) == 0
    assert "episodes" in capsys.readouterr().out            # a PATH: the text report as well, as every command
    assert json.loads((tmp_path / "i.json").read_text()) == info
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


def _compacted(tmp_path, write_episodes, n=4):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=n, seed=0)
    compact(store)
    return store


def test_every_exported_dataset_carries_a_checksum_and_a_damaged_demo_stops_the_import(tmp_path, write_episodes,
                                                                                        capsys):
    """HDF5's Fletcher-32 on every dataset: bytes changed in a demo are an error naming it (before, the import
    took them as data and `validate` passed the copy); the demos before it are merged, a rerun skips them."""
    store = _compacted(tmp_path, write_episodes)
    h5 = tmp_path / "e.h5"
    export_hdf5(store, h5)
    with h5py.File(h5, "r") as f:
        assert all(f[name].fletcher32 for name in _h5_contents(h5) if isinstance(f.get(name), h5py.Dataset))
        offset = f["data/demo_2/actions"].id.get_chunk_info(0).byte_offset
    raw = bytearray(h5.read_bytes())
    raw[offset + 8] ^= 0xFF
    h5.write_bytes(bytes(raw))
    copy = tmp_path / "copy"
    assert main(["dataset", "import-hdf5", "--input", str(h5), "--store", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "demo demo_2 is damaged" in err and "the 2 demo(s) before it are in" in err
    assert len(err.strip().splitlines()) == 1
    assert TrajectoryStore.open(copy).num_episodes == 2 and validate(copy).ok


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                     RuntimeError("Can't decrement id ref count (file write failed: time = x, "
                                                  "errno = 28, error message = 'No space left on device')")])
def test_an_export_that_fills_the_disk_leaves_the_earlier_file_and_no_partial_one(tmp_path, write_episodes, capsys,
                                                                                  monkeypatch, failure):
    """The file is written beside its path and moved onto it at the end: a full disk (said by the OS, or in
    HDF5's own words) is one line, the earlier export is unchanged and no partial file is left."""
    import quadforge.data.export as export
    store = _compacted(tmp_path, write_episodes)
    h5 = tmp_path / "out" / "e.h5"
    export_hdf5(store, h5)
    earlier = h5.read_bytes()
    calls = []

    def fills_up(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise failure
        return write_demo(*args, **kw)
    write_demo = export._write_demo
    monkeypatch.setattr(export, "_write_demo", fills_up)
    assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(h5)]) == 1
    err = capsys.readouterr().err
    assert f"export-hdf5 --output {h5}: No space left on device (ENOSPC); nothing was written" in err
    assert len(err.strip().splitlines()) == 1
    assert h5.read_bytes() == earlier and sorted(p.name for p in h5.parent.iterdir()) == ["e.h5"]


def test_a_disk_or_file_system_failure_is_one_line_from_any_command(tmp_path, write_episodes, capsys, monkeypatch):
    """A read-only store met by compaction's lock (the write failure no job wraps itself) is one line, exit 1."""
    import quadforge.data.compaction as compaction
    store = _compacted(tmp_path, write_episodes)

    def read_only(*args, **kw):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(store / ".lock"))
    monkeypatch.setattr(compaction, "compact", read_only)
    assert main(["dataset", "compact", "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert err == f"quadforge dataset: error: cannot write {store / '.lock'}: Read-only file system (EROFS)\n"


def test_exports_say_when_staged_episodes_are_left_out(tmp_path, write_episodes, capsys):
    store = _compacted(tmp_path, write_episodes)
    write_episodes(store, "c1", n=2, seed=1)
    assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(tmp_path / "e.h5")]) == 0
    err = capsys.readouterr().err
    assert "WARNING: 2 staged episode(s)" in err and f"quadforge dataset compact --store {store}" in err


def test_dataset_info_counts_episodes_per_task(tmp_path, write_episodes, capsys):
    """``tasks`` counts episodes, as ``policies`` and ``collectors`` do (it counted each task's instructions)."""
    store = _compacted(tmp_path, write_episodes, n=6)
    assert main(["dataset", "info", "--store", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    t = TrajectoryStore.open(store).episodes
    assert info["tasks"] == {k: int((t["task"] == k).sum()) for k in set(t["task"].tolist())}
    assert sum(info["tasks"].values()) == 6


def test_no_output_folder_inside_a_store(tmp_path, write_episodes, capsys):
    store = _compacted(tmp_path, write_episodes)
    for argv in (["dataset", "export-lerobot", "--store", str(store), "--output", str(store / "lr")],
                 ["collect", "--store", str(store / "data" / "inner"), "--episodes", "1"],
                 ["dataset", "import-hdf5", "--input", str(tmp_path / "x.h5"), "--store", str(store / "meta" / "i")]):
        if argv[1] == "import-hdf5":
            export_hdf5(store, tmp_path / "x.h5")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"inside the trajectory store {store}" in err, argv
    assert not (store / "lr").exists() and not (store / "data" / "inner").exists()
