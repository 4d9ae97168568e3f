"""Opening a store decodes only the episode table's typed columns: the dict columns (label, extra, task
parameters) stay their segments' JSON text until something reads them, and read as they always did."""
import json

import numpy as np
import pytest

from quadforge.data.compaction import compact
from quadforge.data.episode_table import (DICT_COLUMNS, SEGMENTS_KEY, DeferredColumn, EpisodeTable, encode_segment,
                                          read_table)
from quadforge.data.integrity import file_digest, manifest_digest
from quadforge.data.samplers import TransitionSampler, WindowSampler
from quadforge.data.step_shards import StepShards
from quadforge.data.store import TrajectoryStore
from quadforge.data.store_set import MultiStepShards, StoreSet
from quadforge.data.validate import validate
from quadforge.layout import get_layout


def _store(tmp_path, write_episodes, name="s", sizes=(6, 2, 1)):
    store = tmp_path / name
    for k, n in enumerate(sizes):
        write_episodes(store, f"{name}{k}", n=n, seed=k)
        compact(store)
    return store


def _manifest(store):
    return json.loads((store / "manifest.json").read_text())


def _undecoded(table) -> list[str]:
    return [c for c in DICT_COLUMNS if isinstance(table[c], DeferredColumn) and not table[c].decoded]


def test_dict_columns_read_as_the_eagerly_decoded_table(tmp_path, write_episodes):
    store = _store(tmp_path, write_episodes)
    m = _manifest(store)
    assert len(m[SEGMENTS_KEY]) > 1
    eager = read_table(store, m, defer_dicts=False)
    lazy = TrajectoryStore.open(store).episodes
    assert _undecoded(lazy) == list(DICT_COLUMNS)             # opening decoded none of them
    assert lazy.to_lists() == eager.to_lists()                  # every column, every row, the same values
    assert _undecoded(lazy) == []
    fresh = read_table(store, m)
    assert fresh.row(3) == eager.row(3) and fresh["label"][2] == eager["label"][2]
    assert list(fresh["extra"]) == list(eager["extra"])
    assert np.asarray(fresh["task_params"]).dtype == object and len(fresh["task_params"]) == len(eager)
    # a segment re-encoded from the deferred table is the same file, byte for byte
    seg = m[SEGMENTS_KEY][0]
    assert encode_segment(read_table(store, {**m, SEGMENTS_KEY: [seg], "num_episodes": seg["rows"]}))[1] == seg["sha256"]


@pytest.mark.parametrize("out_of_core", [False, True])
def test_training_leaves_the_dict_columns_undecoded(tmp_path, write_episodes, out_of_core):
    store = _store(tmp_path, write_episodes)
    s = TrajectoryStore.open(store)
    source = StepShards(s) if out_of_core else s
    kw = dict(split="train", val_fraction=0.25, seed=0, filters={"terrain_types": ["flat", "stairs_up"]})
    WindowSampler(source, get_layout("proprio"), context=4, **kw).sample(8)
    TransitionSampler(source, get_layout("proprio"), context=4, **kw).sample(8)
    assert _undecoded(s.episodes) == list(DICT_COLUMNS)
    both = StoreSet([TrajectoryStore.open(store), TrajectoryStore.open(_store(tmp_path, write_episodes, "t", (3,)))])
    joined = both.episodes
    assert _undecoded(joined) == list(DICT_COLUMNS) and len(joined["label"]) == len(joined)
    if out_of_core:
        WindowSampler(MultiStepShards(both), get_layout("proprio"), context=4, **kw).sample(8)
        assert _undecoded(joined) == list(DICT_COLUMNS)
    assert list(joined["label"]) == [*TrajectoryStore.open(store).episodes["label"],
                                     *TrajectoryStore.open(tmp_path / "t").episodes["label"]]


@pytest.mark.parametrize("indent", [None, 1])
def test_a_segment_in_another_layout_is_read_whole(tmp_path, write_episodes, indent):
    """A segment not laid out as ``encode_segment`` writes (indented, its columns in another order) reads
    the same; nothing depends on finding the dict columns' text."""
    store = _store(tmp_path, write_episodes, sizes=(4,))
    m = _manifest(store)
    seg = m[SEGMENTS_KEY][0]
    cols = json.loads((store / seg["file"]).read_text())["columns"]
    expected = read_table(store, m, defer_dicts=False).to_lists()
    data = json.dumps({"columns": dict(reversed(list(cols.items())))}, indent=indent).encode()
    (store / seg["file"]).write_bytes(data)
    seg["sha256"] = file_digest(data)
    m["digest"] = manifest_digest(m)
    (store / "manifest.json").write_text(json.dumps(m))
    assert TrajectoryStore.open(store).episodes.to_lists() == expected
    assert validate(store).ok


@pytest.mark.parametrize("damage", ["not json", "short"])
def test_undecodable_dict_columns_name_the_segment(tmp_path, write_episodes, damage):
    """Text that passes the digest but does not decode (a writer's bug, or a file and digest replaced
    together): an error naming the segment when read, and a problem in the validator's report."""
    store = _store(tmp_path, write_episodes, sizes=(4,))
    m = _manifest(store)
    seg = m[SEGMENTS_KEY][0]
    data = (store / seg["file"]).read_bytes()
    cut = data.index(b', "label": [')
    if damage == "not json":
        data = data[:cut] + b', "label": [{"x": 1}, {"y" 2}], "extra": [], "task_params": []}}'
    else:
        data = data[:cut] + b', "label": [{}], "extra": [{}, {}, {}, {}], "task_params": [{}, {}, {}, {}]}}'
    (store / seg["file"]).write_bytes(data)
    seg["sha256"] = file_digest(data)
    m["digest"] = manifest_digest(m)
    (store / "manifest.json").write_text(json.dumps(m))
    table = TrajectoryStore.open(store).episodes                # the typed columns are sound
    assert len(table) == 4 and table["success"].dtype == bool
    with pytest.raises(ValueError, match=f"{seg['file']}: corrupt episode table"):
        table["label"][0]
    report = validate(store)
    assert not report.ok and any(seg["file"] in p and "corrupt episode table" in p for p in report.problems)


def test_a_deferred_table_pickles_and_joins():
    import pickle
    rows = [{**{c: 0 for c in ("start", "end", "length", "terrain_level", "instruction_index", "seed")},
             "instruction_id": -1, "success": True, "terminated": False, "return": 1.0, "cmd_vx": 0.1,
             "cmd_vy": 0.0, "cmd_wz": 0.0, **{c: "x" for c in ("failure_reason", "terrain_type", "task", "gait",
                                                                 "policy_id", "collector_id", "episode_id")},
             "label": {"k": i}, "extra": {"i": i}, "task_params": {}} for i in range(3)]
    data, _ = encode_segment(EpisodeTable.from_rows(rows))
    from quadforge.data.episode_table import _parse_segment
    table = _parse_segment(data, "seg.json", defer_dicts=True)
    again = pickle.loads(pickle.dumps(table))
    assert _undecoded(again) == list(DICT_COLUMNS)
    both = EpisodeTable.joined([table, again])
    assert isinstance(both["label"], DeferredColumn) and [d["k"] for d in both["label"]] == [0, 1, 2, 0, 1, 2]
    assert both.head(2)["extra"].tolist() == [{"i": 0}, {"i": 1}] and both.head(6) is both


def test_threads_reading_a_deferred_column_at_once_all_get_it(tmp_path, write_episodes):
    """The image sampler's prefetch threads may read the table together: each gets the decoded column,
    none meets the text another dropped."""
    import threading
    store = _store(tmp_path, write_episodes, sizes=(30, 10))
    expected = read_table(store, _manifest(store), defer_dicts=False).to_lists()
    for _ in range(20):
        table = TrajectoryStore.open(store).episodes
        got, errors = {}, []
        start = threading.Barrier(6)

        def read(i):
            try:
                start.wait()
                got[i] = [list(table["label"]), list(table["extra"])]
            except Exception as err:   # noqa: BLE001 - any failure is the finding
                errors.append(err)
        threads = [threading.Thread(target=read, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and all(v == [expected["label"], expected["extra"]] for v in got.values())


def test_the_text_stays_readable_after_a_compaction_deletes_its_segment(tmp_path, write_episodes):
    """The dict columns stay in a read-only map of their segment file: a compaction that merges the segment
    away (and deletes its file) after the open leaves them readable, as they were committed."""
    import pickle
    store = _store(tmp_path, write_episodes, sizes=(6, 2))
    before = _manifest(store)[SEGMENTS_KEY]
    expected = read_table(store, _manifest(store), defer_dicts=False).to_lists()
    table = TrajectoryStore.open(store).episodes
    write_episodes(store, "late", n=8, seed=9)
    compact(store)                                               # merges every earlier segment into one
    assert not any((store / seg["file"]).exists() for seg in before)
    shipped = pickle.loads(pickle.dumps(table))                  # a map does not pickle: its bytes do
    assert table.to_lists() == expected and shipped.to_lists() == expected


def test_a_segment_rewritten_in_place_after_the_open_is_an_error(tmp_path, write_episodes):
    store = _store(tmp_path, write_episodes, sizes=(4,))
    seg = _manifest(store)[SEGMENTS_KEY][0]
    table = TrajectoryStore.open(store).episodes
    with open(store / seg["file"], "r+b") as f:                 # same length, one byte changed, same inode
        data = bytearray(f.read())
        i = data.index(b'"label": [') + 12
        data[i:i + 1] = b" " if data[i:i + 1] != b" " else b"\n"
        f.seek(0)
        f.write(bytes(data))
    with pytest.raises(ValueError, match="changed since the store was opened"):
        table["label"][0]
