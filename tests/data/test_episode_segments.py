"""The episode table in append-only segments: a compaction writes its new rows (merged with short trailing
segments) instead of rewriting the table; format-1 stores (one table file) still read and grow."""
import json

import numpy as np
import pytest

import quadforge.data.compaction as compaction
import quadforge.data.store as store_module
from quadforge.data import episode_table
from quadforge.data.cli import summary
from quadforge.data.compaction import compact
from quadforge.data.episode_table import (LEGACY_FILE, MERGE_RATIO, SEGMENTS_KEY, SegmentMissing, merge_start,
                                          read_table, segment_file, segment_files_on_disk)
from quadforge.data.integrity import manifest_digest
from quadforge.data.store import TrajectoryStore, read_manifest
from quadforge.data.validate import validate


def _manifest(store):
    return json.loads((store / "manifest.json").read_text())


def _grow(store, write_episodes, sizes, first=0):
    """One compaction per size, each of episodes from its own collector; their ids in order."""
    ids = []
    for k, n in enumerate(sizes, start=first):
        ids += [eid for eid, _, _ in write_episodes(store, f"c{k}", n=n, seed=k, lengths=[3] * n)]
        compact(store)
    return ids


def test_merge_start_keeps_segments_halving_along_the_list():
    rng = np.random.default_rng(0)
    rows: list[int] = []
    for _ in range(2000):
        new = int(rng.integers(1, 100))
        i = merge_start(rows, new)
        rows = rows[:i] + [sum(rows[i:]) + new]
        assert all(a >= MERGE_RATIO * b for a, b in zip(rows, rows[1:]))
    assert len(rows) <= np.log2(sum(rows)) + 1
    assert merge_start([], 5) == 0 and merge_start([100], 5) == 1 and merge_start([8, 4], 3) == 0


def test_compactions_append_segments_and_the_table_reads_in_order(tmp_path, write_episodes):
    store = tmp_path / "s"
    ids = _grow(store, write_episodes, [8, 1, 1, 1, 2, 1, 5])
    s = TrajectoryStore.open(store)
    assert s.episode_ids == ids and s.num_episodes == len(ids)
    assert np.array_equal(s.episodes["start"][1:], s.episodes["end"][:-1])
    m = _manifest(store)
    assert m["format_version"] == 2 and "episodes" not in m["meta"]
    rows = [seg["rows"] for seg in m[SEGMENTS_KEY]]
    assert len(rows) > 1 and all(a >= MERGE_RATIO * b for a, b in zip(rows, rows[1:]))
    # merged segments are deleted: exactly the listed files are on disk, each named after its generation
    listed = {seg["file"] for seg in m[SEGMENTS_KEY]}
    assert segment_files_on_disk(store) == listed and segment_file(m["generation"]) in listed
    assert validate(store).ok
    info = summary(store)
    assert info["format_version"] == 2 and info["table_segments"] == len(rows)


def test_a_compaction_reads_only_the_segments_it_merges(tmp_path, write_episodes, monkeypatch):
    """Its cost is the new rows and the short tail it merges, not the whole table."""
    store = tmp_path / "s"
    _grow(store, write_episodes, [40, 2])
    assert [seg["rows"] for seg in _manifest(store)[SEGMENTS_KEY]] == [40, 2]
    read = []
    real = episode_table.read_segment
    monkeypatch.setattr(compaction, "read_segment", lambda root, seg, *a: read.append(seg["rows"]) or real(root, seg, *a))
    _grow(store, write_episodes, [3], first=2)        # 2 < 2 * 5: merges the 2-row tail, not the 40 rows
    assert read == [2] and [seg["rows"] for seg in _manifest(store)[SEGMENTS_KEY]] == [40, 5]


def test_staged_leftovers_of_a_crash_after_the_commit_are_not_appended_twice(tmp_path, write_episodes, monkeypatch):
    store = tmp_path / "s"
    _grow(store, write_episodes, [20])
    write_episodes(store, "c1", n=2, seed=1, lengths=[3, 3])
    monkeypatch.setattr(compaction, "_delete", lambda paths, root: None)   # the crash: nothing deleted after step 6
    compact(store)
    monkeypatch.undo()
    assert len(list((store / "staging").glob("*.episode"))) == 2
    result = compact(store)
    assert result.appended == [] and len(result.skipped) == 2 and TrajectoryStore.open(store).num_episodes == 22


def test_crash_leftover_segments_are_overwritten_or_deleted(tmp_path, write_episodes):
    store = tmp_path / "s"
    _grow(store, write_episodes, [10])
    g = _manifest(store)["generation"]
    (store / segment_file(g + 1)).write_text("{half a file")           # an uncommitted compaction's segment
    (store / segment_file(0)).write_text("{}")                          # one a crash kept from deleting
    rep = validate(store)
    assert rep.ok and any("2 episode table segment file(s) the manifest does not list" in n for n in rep.notes)
    _grow(store, write_episodes, [1], first=1)
    assert segment_files_on_disk(store) == {seg["file"] for seg in _manifest(store)[SEGMENTS_KEY]}
    assert TrajectoryStore.open(store).num_episodes == 11


def test_a_reader_with_a_stale_manifest_reads_the_new_one(tmp_path, write_episodes, monkeypatch):
    store = tmp_path / "s"
    _grow(store, write_episodes, [4, 1])
    stale = read_manifest(store)
    _grow(store, write_episodes, [1], first=2)         # merges both segments away
    with pytest.raises(SegmentMissing, match="missing episode table segment"):
        read_table(store, stale)
    real, reads = store_module.read_manifest, []

    def first_read_is_stale(root):   # the reader read the manifest just before that compaction committed
        reads.append(root)
        return stale if len(reads) == 1 else real(root)
    monkeypatch.setattr(store_module, "read_manifest", first_read_is_stale)
    assert TrajectoryStore.open(store).num_episodes == 6 and len(reads) == 2


def test_a_format_1_store_reads_and_its_next_compactions_append_after_its_table(tmp_path, write_episodes, as_format_1):
    store = tmp_path / "s"
    ids = _grow(store, write_episodes, [6])
    as_format_1(store)
    assert TrajectoryStore.open(store).episode_ids == ids and validate(store).ok
    ids += _grow(store, write_episodes, [1], first=1)
    m = _manifest(store)
    assert m["format_version"] == 2 and [seg["file"] for seg in m[SEGMENTS_KEY]][0] == LEGACY_FILE
    assert TrajectoryStore.open(store).episode_ids == ids and validate(store).ok
    ids += _grow(store, write_episodes, [5], first=2)  # merges the old table into a segment: its file goes
    assert not (store / LEGACY_FILE).exists() and TrajectoryStore.open(store).episode_ids == ids
    # a damaged format-1 table is still caught by its old digest
    as_format_1(store)
    t = json.loads((store / LEGACY_FILE).read_text())
    t["columns"]["success"][0] = not t["columns"]["success"][0]
    (store / LEGACY_FILE).write_text(json.dumps(t))
    with pytest.raises(ValueError, match="episode table differs"):
        TrajectoryStore.open(store)


def test_an_unknown_format_is_refused_with_what_this_code_reads(tmp_path, write_episodes):
    store = tmp_path / "s"
    _grow(store, write_episodes, [2])
    m = _manifest(store)
    m["format_version"] = 3
    m["digest"] = manifest_digest(m)
    (store / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"format_version 3; this code reads 1 and 2 \(writes 2\)"):
        TrajectoryStore.open(store)


def _open_in_a_loop(root, stop, results):
    """A reader process: open the store until told to stop; (opens, unexpected errors)."""
    from quadforge.data.store import TrajectoryStore
    opens, errors, last = 0, [], 0
    while not stop.is_set():
        try:
            store = TrajectoryStore.open(root)
            if store.num_episodes < last or len(store.episode_ids) != store.num_episodes:
                errors.append(f"went back to {store.num_episodes} episodes from {last}")
            last, opens = store.num_episodes, opens + 1
        except FileNotFoundError as err:
            if "no manifest" not in str(err):   # before the first compaction there is none yet
                errors.append(str(err))
        except Exception as err:   # anything else is a reader failing under the writer
            errors.append(f"{type(err).__name__}: {err}")
    results.put((opens, errors[:5]))


def test_a_reader_never_fails_while_compactions_merge_and_delete_segments(tmp_path):
    import multiprocessing as mp
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    from quadforge.data.writer import StagingWriter
    root = tmp_path / "s"
    ctx = mp.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_open_in_a_loop, args=(root, stop, results))
    reader.start()
    rng = np.random.default_rng(0)
    writer = StagingWriter(root, "w")
    try:
        for _ in range(60):
            for i in range(int(rng.integers(1, 6))):
                writer.write_episode(synthetic_episode(rng, 3, True, ("actions", "rewards")), synthetic_info(i, True))
            compact(root)
    finally:
        stop.set()
        opens, errors = results.get(timeout=60)
        reader.join(timeout=60)
    assert errors == [] and opens > 0
    m = _manifest(root)
    assert m["generation"] == 60 and len(m[SEGMENTS_KEY]) < 10   # merges replaced (and deleted) most segments
