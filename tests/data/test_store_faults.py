"""What a user meets when a store write goes wrong: one line saying the store, what failed, that the
committed episodes are intact and how to go on - never a traceback; and no partial write left behind."""
import errno
import os

import numpy as np
import pytest

import quadforge.data.staging as staging
from quadforge.data.compaction import compact
from quadforge.data.locks import acquire
from quadforge.data.staging import list_staged, partial_writes, writer_lock_path
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_info
from quadforge.data.validate import validate
from quadforge.data.writer import StagingWriter
from quadforge.errors import JobFailed
from quadforge.tools.cli import main


def _disk_full():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FillsUp:
    """A file object that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, b):
        if len(b) > self.room:
            self.f.write(bytes(b)[:self.room])
            self.room = 0
            raise _disk_full()
        self.room -= len(b)
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _fill_disk_while_staging(monkeypatch, room=200):
    monkeypatch.setattr(staging, "open", lambda path, mode="r": _FillsUp(open(path, mode), room), raising=False)


def test_never_compacted_store_says_which_command_recovers(tmp_path, write_episodes, capsys):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=3, seed=0)   # staged, as a collection killed before its first compaction
    want = f"quadforge dataset compact --store {store}"
    with pytest.raises(FileNotFoundError, match="3 staged episode"):
        TrajectoryStore.open(store)
    assert main(["dataset", "validate", "--store", str(store)]) == 1
    assert want in capsys.readouterr().out
    assert main(["dataset", "info", "--store", str(store)]) == 2
    assert want in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--store", str(store), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert want in err and len(err.strip().splitlines()) == 1
    assert main(["dataset", "compact", "--store", str(store)]) == 0   # the named command recovers
    assert validate(store).ok and TrajectoryStore.open(store).num_episodes == 3


def test_disk_full_while_staging_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    store = tmp_path / "s"
    rng = np.random.default_rng(0)
    w = StagingWriter(store, "c0")
    w.write_episode(synthetic_episode(rng, 10, True), synthetic_info(0, True))
    _fill_disk_while_staging(monkeypatch)
    with pytest.raises(JobFailed) as failed:
        w.write_episode(synthetic_episode(rng, 10, True), synthetic_info(1, True))
    msg = str(failed.value)
    assert len(msg.splitlines()) == 1
    assert str(store) in msg and "No space left on device (ENOSPC)" in msg
    assert "intact" in msg and "rerun the same command" in msg
    assert partial_writes(store) == [] and [p.stem for p in list_staged(store)] == ["c0-00000000"]
    monkeypatch.undo()
    assert w.write_episode(synthetic_episode(rng, 10, True), synthetic_info(1, True)) == "c0-00000001"


def test_disk_full_while_collecting_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    pytest.importorskip("quadforge.experts.gait")
    store = tmp_path / "s"
    _fill_disk_while_staging(monkeypatch)
    argv = ["collect", "--store", str(store), "--episodes", "2", "--num-envs", "2", "--max-episode-s", "0.2",
            "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err and str(store) in err and "Traceback" not in err
    assert partial_writes(store) == []
    monkeypatch.undo()
    assert main(argv) == 0   # room again: the same command resumes to the target
    assert TrajectoryStore.open(store).num_episodes == 2


def test_disk_full_during_compaction_is_one_line_and_keeps_the_committed_generation(tmp_path, write_episodes,
                                                                                   monkeypatch, capsys):
    import zarr.storage._local as zarr_local
    store = tmp_path / "s"
    write_episodes(store, "c0", n=3, seed=0)
    compact(store)
    before = TrajectoryStore.open(store).load()
    write_episodes(store, "c1", n=2, seed=1)

    def full(path, value, exclusive=False):
        raise _disk_full()
    monkeypatch.setattr(zarr_local, "_put", full)   # zarr's one chunk write
    assert main(["dataset", "compact", "--store", str(store)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{store}: compaction failed: No space left on device (ENOSPC)" in err
    assert "generation 1 (3 episodes) is intact" in err and "2 staged episode(s) are kept" in err
    assert f"quadforge dataset compact --store {store}" in err
    monkeypatch.undo()
    assert validate(store).ok
    s = TrajectoryStore.open(store)
    assert s.generation == 1 and all(np.array_equal(s.load([k])[k], v) for k, v in before.items())
    assert main(["dataset", "compact", "--store", str(store)]) == 0   # room again: the named command finishes
    assert TrajectoryStore.open(store).num_episodes == 5 and validate(store).ok


def test_partial_writes_are_reported_then_removed_unless_their_writer_is_alive(tmp_path, write_episodes, capsys):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=2, seed=0)
    compact(store)
    d = store / "staging"
    dead = d / ".tmp-c0-00000002-4242.episode"     # a writer of c0 killed mid-write
    live = d / ".tmp-c7-00000000-4343.episode"     # c7's writer is still writing
    dead.write_bytes(b"QFEPISODE1\n" + b"\0" * 100)
    live.write_bytes(b"QFEPISODE1\n")
    c7 = acquire(writer_lock_path(store, "c7"), "test writer c7")
    rep = validate(store)
    assert rep.ok and len(rep.warnings) == 1
    assert str(dead) in rep.warnings[0] and "partial staging write" in rep.warnings[0]
    assert main(["dataset", "compact", "--store", str(store)]) == 0
    assert f"removed {dead}" in capsys.readouterr().out
    assert not dead.exists() and live.exists()     # a live writer's temp file is never touched
    c7.release()
    assert partial_writes(store) == [live]
    StagingWriter(store, "c0").close()              # another collector's writer leaves it alone
    assert live.exists()
    w = StagingWriter(store, "c7")                  # the collector's next writer removes its own
    assert w.removed_partial == [live] and not live.exists()
    w.close()
    assert validate(store).warnings == []
