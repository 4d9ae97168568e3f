"""Issue 13's store cases: a damaged store is refused by every reader (cheaply, from the manifest) and
reported by validate; old stores still open; concurrent writers never collide."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quadforge.data.locks import LockHeldError, acquire
from quadforge.data.writer import StagingWriter
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.validate import validate


def _store(tmp_path, write_episodes, n=4, name="s"):
    store = tmp_path / name
    write_episodes(store, "c0", n=n, seed=0)
    compact(store)
    write_episodes(store, "c1", n=2, seed=1)   # a second compaction extends the partial chunk
    compact(store)
    return store


def _chunk_files(store, feature):
    return sorted(p for p in (store / "data" / feature / "c").rglob("*") if p.is_file())


def test_missing_chunk_refused_by_every_reader(tmp_path, small_chunks, write_episodes):
    store = _store(tmp_path, write_episodes)
    _chunk_files(store, "actions")[0].unlink()
    # the case: training exited 0 on all-zero actions; now open refuses from the manifest
    with pytest.raises(ValueError, match=r"data/actions: chunk\(s\) \[0\] missing"):
        TrajectoryStore.open(store)
    from quadforge.tools.cli import main
    assert main(["train", "--model", "fcnet", "--store", str(store), "--out", str(tmp_path / "run"),
                 "--max-steps", "5"]) == 2
    assert not (tmp_path / "run" / "last.pt").exists()
    from quadforge.data.export import export_hdf5
    with pytest.raises(ValueError, match="missing"):
        export_hdf5(store, tmp_path / "x.h5")
    from quadforge.data.cli import summary
    with pytest.raises(ValueError, match="missing"):
        summary(store)
    assert any("chunk(s) [0] missing" in p for p in validate(store, check_values=False, checksums=False).problems)
    write_episodes(store, "c9", n=1)              # and compaction does not append onto the damage
    with pytest.raises(ValueError, match="missing"):
        compact(store)


def test_open_is_cheap_no_chunk_is_read(tmp_path, small_chunks, write_episodes, monkeypatch):
    store = _store(tmp_path, write_episodes)
    import quadforge.data.integrity as integrity
    monkeypatch.setattr(integrity, "crc_rows", lambda *a, **k: pytest.fail("open read chunk data"))
    TrajectoryStore.open(store)


def test_flipped_bytes_in_a_chunk_are_detected(tmp_path, small_chunks, write_episodes):
    store = _store(tmp_path, write_episodes)
    chunk = _chunk_files(store, "dof_pos")[1]
    raw = bytearray(chunk.read_bytes())
    for i in range(20, min(len(raw) - 4, 84)):   # the 64 flipped bytes
        raw[i] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    rep = validate(store, check_values=False)     # the CLI's default level
    assert not rep.ok and any("dof_pos" in p and "[1]" in p for p in rep.problems), rep.text()
    with pytest.raises(ValueError, match="dof_pos"):
        TrajectoryStore.open(store).load(["dof_pos"])


def test_swapped_chunks_are_detected_by_readers_and_validate(tmp_path, small_chunks, write_episodes):
    store = _store(tmp_path, write_episodes)
    a, b = _chunk_files(store, "dof_vel")[:2]
    ra, rb = a.read_bytes(), b.read_bytes()
    a.write_bytes(rb)
    b.write_bytes(ra)
    with pytest.raises(ValueError, match=r"data/dof_vel: chunk\(s\) \[0, 1\] fail their checksum"):
        TrajectoryStore.open(store).load(["dof_vel"])
    rep = validate(store, check_values=False)
    assert any("dof_vel" in p and "CRC32C" in p for p in rep.problems), rep.text()


def test_edited_table_or_manifest_is_detected(tmp_path, write_episodes):
    store = _store(tmp_path, write_episodes)
    path = TrajectoryStore.open(store).table_files[-1]
    table = json.loads(path.read_text())
    table["columns"]["success"][0] = not table["columns"]["success"][0]   # valid JSON, wrong label
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="episode table differs"):
        TrajectoryStore.open(store)
    assert any(f"{path}: episode table differs" in p for p in validate(store).problems)


def test_each_compactions_segment_digest_is_the_digest_of_the_file_a_reader_reads(tmp_path, write_episodes):
    from quadforge.data.episode_table import SEGMENTS_KEY
    from quadforge.data.integrity import file_digest
    store = tmp_path / "s"
    for k in range(3):
        write_episodes(store, f"c{k}", n=2 + k, seed=k)
        compact(store)
        manifest = json.loads((store / "manifest.json").read_text())
        for segment in manifest[SEGMENTS_KEY]:
            data = (store / segment["file"]).read_bytes()
            assert segment["rows"] == len(json.loads(data)["columns"]["end"])
            assert segment["sha256"] == file_digest(data)
        assert manifest["num_episodes"] == sum(s["rows"] for s in manifest[SEGMENTS_KEY])
    assert manifest["num_episodes"] == 2 + 3 + 4 and validate(store).ok

def test_store_without_checksums_still_opens_and_gets_them_at_the_next_compaction(tmp_path, small_chunks,
                                                                                write_episodes):
    """A store written before this change: no integrity records, no Crc32cCodec in its arrays."""
    store = tmp_path / "old"
    eps = write_episodes(store, "c0", n=3, seed=0)
    compact(store)
    expected = TrajectoryStore.open(store).load()
    m = json.loads((store / "manifest.json").read_text())
    for key in ("integrity", "checksums", "meta", "digest"):
        m.pop(key)
    (store / "manifest.json").write_text(json.dumps(m))
    s = TrajectoryStore.open(store)
    np.testing.assert_array_equal(s.load(["actions"])["actions"], expected["actions"])
    rep = validate(store)
    assert rep.ok and any("written before chunk checksums" in n for n in rep.notes)
    write_episodes(store, "c1", n=1, seed=3)
    compact(store)
    assert "checksums" in json.loads((store / "manifest.json").read_text())
    assert validate(store).ok and not any("before chunk checksums" in n for n in validate(store).notes)
    assert len(eps) == 3


def test_damaged_staging_file_is_quarantined_not_merged(tmp_path, write_episodes):
    store = _store(tmp_path, write_episodes)
    (eid, _, _), = write_episodes(store, "c2", n=1, seed=5)
    path = store / "staging" / f"{eid}.episode"
    raw = bytearray(path.read_bytes())
    data_start = 11 + 8 + int.from_bytes(raw[11:19], "little")
    raw[data_start + 10] ^= 0x01                  # one bit inside the first array
    path.write_bytes(bytes(raw))
    r = compact(store)
    assert r.appended == [] and len(r.quarantined) == 1
    assert "CRC32C" in (store / "quarantine" / f"{eid}.episode.reason.txt").read_text()
    assert validate(store).ok and validate(store).warnings


# --- concurrent writers ------------------------------------------------------------------------------

HOLD = ("import sys, time; from quadforge.data.writer import StagingWriter; "
        "w = StagingWriter(sys.argv[1], 'main'); print('held', flush=True); sys.stdin.readline()")


def test_second_writer_with_the_same_collector_id_is_refused_naming_the_holder(tmp_path):
    store = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(store)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(LockHeldError, match=rf"pid {proc.pid} on host .*episode ids would collide"):
            StagingWriter(store, "main")
        StagingWriter(store, "other").close()   # another collector id is fine
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    StagingWriter(store, "main").close()        # released when its process ended


def test_stale_lock_of_a_killed_process_is_taken_over(tmp_path):
    path = tmp_path / ".collect.lock"
    script = ("import sys, os; from quadforge.data.locks import acquire; l = acquire(sys.argv[1], 'collect'); "
              "print('held', flush=True); os.kill(os.getpid(), 9)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == "held" and proc.returncode == -9
    assert f'"pid": {proc.pid}' in path.read_text()     # the record outlived its holder...
    lock = acquire(path, "collect")                      # ...but the flock did not
    assert lock.stale_holder is not None and f"pid {proc.pid}" in lock.stale_holder
    with pytest.raises(LockHeldError, match=f"collect pid {os.getpid()}"):
        acquire(path, "collect")
    lock.release()
    assert acquire(path, "collect").stale_holder is None   # a clean release leaves no record


def test_second_collect_on_a_store_is_refused_naming_the_first(tmp_path):
    """Two real processes: one holds the store's collect lock, the real `quadforge collect` CLI is refused."""
    store = tmp_path / "s"
    script = ("import sys; from quadforge.collection.collect import collect_lock; l = collect_lock(sys.argv[1]); "
              "print('held', flush=True); sys.stdin.readline()")
    holder = subprocess.Popen([sys.executable, "-c", script, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run([sys.executable, "-m", "quadforge.tools.cli", "collect", "--store", str(store),
                                 "--episodes", "4", "--num-envs", "2", "--no-progress"],
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        assert f"collect pid {holder.pid} on host" in second.stderr and "one collect per store" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    assert not (store / "staging").exists() or not any((store / "staging").glob("*.episode"))


def test_import_of_colliding_ids_from_another_store_is_refused_not_skipped(tmp_path, write_episodes):
    """Ids are unique within a store; another store's `c0-00000000` is a different episode, and
    skipping it as "already imported" would silently drop it."""
    from quadforge.data.export import export_hdf5, import_hdf5
    a, b = tmp_path / "a", tmp_path / "b"
    write_episodes(a, "c0", n=2, seed=0)
    compact(a)
    write_episodes(b, "c0", n=2, seed=1, lengths=[7, 9])
    compact(b)
    export_hdf5(a, tmp_path / "a.h5")
    assert import_hdf5(tmp_path / "a.h5", tmp_path / "fresh") == 2
    assert import_hdf5(tmp_path / "a.h5", tmp_path / "fresh") == 0          # a re-import: same episodes
    with pytest.raises(ValueError, match=r"episode id 'c0-00000000', which .* already holds for a different episode"
                                         r".*--collector-id NEW"):
        import_hdf5(tmp_path / "a.h5", b)
    assert TrajectoryStore.open(b).num_episodes == 2


def test_stores_collected_under_one_id_merge_under_a_new_collector_id(tmp_path, write_episodes, capsys):
    """Two collections under the same collector id collide on import; `import-hdf5 --collector-id NEW` stages
    the demos under NEW's next ids, each keeping its own as source_episode_id, and a re-import skips them."""
    from quadforge.data.export import export_hdf5
    from quadforge.tools.cli import main
    a, b = tmp_path / "a", tmp_path / "b"
    write_episodes(a, "main", n=2, seed=0)
    compact(a)
    write_episodes(b, "main", n=3, seed=1, lengths=[7, 9, 11])
    compact(b)
    export_hdf5(a, tmp_path / "a.h5")
    for _ in range(2):   # the second time: every demo was imported under "from_a" already
        assert main(["dataset", "import-hdf5", "--input", str(tmp_path / "a.h5"), "--store", str(b),
                     "--collector-id", "from_a"]) == 0
    merged = TrajectoryStore.open(b)
    t = merged.episodes
    assert list(t["episode_id"]) == ["main-00000000", "main-00000001", "main-00000002", "from_a-00000000",
                                     "from_a-00000001"]
    assert [x.get("source_episode_id") for x in t["extra"]][3:] == ["main-00000000", "main-00000001"]
    original = TrajectoryStore.open(a)
    for k in ("actions", "dof_pos"):
        np.testing.assert_array_equal(merged.load([k])[k][-original.num_steps:], original.load([k])[k])
    assert validate(b).ok
    assert main(["dataset", "import-hdf5", "--input", str(tmp_path / "a.h5"), "--store", str(b),
                 "--collector-id", ".x"]) == 2
    assert "--collector-id='.x' is invalid" in capsys.readouterr().err


def test_an_import_tells_episodes_of_equal_length_and_run_seed_apart(tmp_path):
    """Two collections with the same collector id and seed name their episodes alike, with equal lengths
    and the same run seed: only the episodes' own records tell them apart (they must, or the import
    would skip a different episode as already there)."""
    from quadforge.data.export import export_hdf5, import_hdf5
    from quadforge.tools.cli import main
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--episodes", "1", "--max-episode-s", "0.5", "--no-progress", "--seed", "0"]
    assert main(["collect", "--store", str(a), "--num-envs", "1", *common]) == 0
    assert main(["collect", "--store", str(b), "--num-envs", "2", "--terrain", "rough_slope", *common]) == 0
    export_hdf5(b, tmp_path / "b.h5")
    assert import_hdf5(tmp_path / "b.h5", b) == 0                          # a re-import skips its own
    with pytest.raises(ValueError, match=r"already holds for a different episode .*record differs"):
        import_hdf5(tmp_path / "b.h5", a)
    assert TrajectoryStore.open(a).num_episodes == 1


def _last_chunk_partial(store, feature):
    """The last chunk file of ``feature`` when the committed rows end inside it (what the next append rewrites)."""
    m = json.loads((store / "manifest.json").read_text())
    import zarr
    arr = zarr.open_group(str(store), mode="r")[f"data/{feature}"]
    n, chunk = int(m["lengths"][feature]), arr.chunks[0]
    assert n % chunk, "the test needs a partial last chunk"
    return store / "data" / feature / "c" / str(n // chunk) / "0"


@pytest.mark.parametrize("damage", ["flipped bytes", "another chunk's valid bytes"])
def test_an_append_onto_a_damaged_last_chunk_is_refused_naming_it(tmp_path, small_chunks, write_episodes, damage):
    """Compaction rewrites the partial last chunk with the new rows after the old: it checks the old rows
    against their recorded CRC first, so the damage is named, not hidden under a new generation's checksums
    (or a codec error naming no array), and nothing changes: the staged episodes wait for a repaired store."""
    store = tmp_path / "s"
    write_episodes(store, "c0", n=3, seed=0, lengths=[5, 6, 7])   # 18 rows: chunks of 4 end inside one
    compact(store)
    last = _last_chunk_partial(store, "dof_pos")
    if damage == "flipped bytes":
        raw = bytearray(last.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        last.write_bytes(bytes(raw))
    else:
        last.write_bytes(_chunk_files(store, "dof_pos")[0].read_bytes())
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file() and "staging" not in p.parts}
    write_episodes(store, "c2", n=2, seed=2)
    with pytest.raises(ValueError, match=r"'dof_pos' chunk \d+ \(rows \d+-\d+\) (does not read back|differs from its "
                                         r"recorded checksum).*nothing was appended.*dataset validate"):
        compact(store)
    after = {p: p.read_bytes() for p in store.rglob("*") if p.is_file() and "staging" not in p.parts}
    assert after == before   # no array resized, no chunk written, the manifest as it was
    assert len(list((store / "staging").glob("c2-*.episode"))) == 2
