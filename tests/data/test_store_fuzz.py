"""Randomly damaged copies of a small store: every one ends in a clear error (validate's report, or a
ValueError/FileNotFoundError from opening or reading) or in a correct read - never a traceback, never
silently different data. The default run damages FUZZ_CASES copies; the slow run FUZZ_CASES_SLOW more."""
import json
import shutil

import numpy as np
import pytest

from quadforge.data.cli import summary
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.validate import validate

FEATURES = ("actions", "dof_pos", "rewards", "terminated")   # float vectors, a scalar, a bool
FUZZ_CASES = 100
FUZZ_CASES_SLOW = 1000
DAMAGES = ("truncate", "delete", "flip", "swap", "swap_chunks", "append", "empty")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store of two compactions (the second extends a partial chunk), chunks of 64 steps, plus what
    a correct read returns."""
    import quadforge.data.compaction as c
    from quadforge.data.writer import StagingWriter
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    old = c.TARGET_CHUNK_BYTES
    c.TARGET_CHUNK_BYTES = 4096
    try:
        root = tmp_path_factory.mktemp("fuzz") / "store"
        rng = np.random.default_rng(0)
        for collector, n in (("a", 4), ("b", 3)):
            with StagingWriter(root, collector) as w:
                for i in range(n):
                    success = i % 3 != 2
                    ep = synthetic_episode(rng, int(rng.integers(20, 90)), success)
                    w.write_episode({k: ep[k] for k in FEATURES}, synthetic_info(i, success))
            compact(root)
    finally:
        c.TARGET_CHUNK_BYTES = old
    s = TrajectoryStore.open(root)
    return root, _snapshot(s)


def _snapshot(s: TrajectoryStore) -> dict:
    return {"data": s.load(), "table": json.dumps(s.episodes.to_lists(), sort_keys=True, default=str),
            "tasks": json.dumps(s.tasks, sort_keys=True), "stats": json.dumps(s.manifest["stats"], sort_keys=True),
            "schema": json.dumps(s.schema.to_dict(), sort_keys=True), "n": s.num_steps}


def _files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def _damage(root, rng) -> str:
    files = _files(root)
    kind = DAMAGES[int(rng.integers(len(DAMAGES)))]
    f = files[int(rng.integers(len(files)))]
    rel = f.relative_to(root)
    raw = f.read_bytes()
    if kind == "truncate":
        f.write_bytes(raw[:int(rng.integers(0, max(1, len(raw))))])
    elif kind == "delete":
        f.unlink()
    elif kind == "empty":
        f.write_bytes(b"")
    elif kind == "append":
        f.write_bytes(raw + rng.bytes(int(rng.integers(1, 64))))
    elif kind == "flip":
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 65))):
            if b:
                b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
        f.write_bytes(bytes(b))
    elif kind == "swap":
        g = files[int(rng.integers(len(files)))]
        rg = g.read_bytes()
        g.write_bytes(raw)
        f.write_bytes(rg)
        rel = f"{rel}<->{g.relative_to(root)}"
    else:   # two chunks of one array: each decodes and passes zarr's own CRC, only their place is wrong
        chunks = [p for p in files if "/c/" in str(p)]
        f = chunks[int(rng.integers(len(chunks)))]
        siblings = [p for p in chunks if p.relative_to(root).parts[:2] == f.relative_to(root).parts[:2] and p != f]
        if not siblings:
            return "noop"
        g = siblings[int(rng.integers(len(siblings)))]
        ra, rb = f.read_bytes(), g.read_bytes()
        f.write_bytes(rb)
        g.write_bytes(ra)
        rel = f"{f.relative_to(root)}<->{g.relative_to(root)}"
    return f"{kind} {rel}"


def _same(snap: dict, s: TrajectoryStore, data: dict) -> bool:
    if s.num_steps != snap["n"] or set(data) != set(snap["data"]):
        return False
    if any(data[k].dtype != v.dtype or data[k].shape != v.shape or data[k].tobytes() != v.tobytes()
           for k, v in snap["data"].items()):
        return False
    return (json.dumps(s.episodes.to_lists(), sort_keys=True, default=str) == snap["table"]
            and json.dumps(s.tasks, sort_keys=True) == snap["tasks"]
            and json.dumps(s.manifest["stats"], sort_keys=True) == snap["stats"]
            and json.dumps(s.schema.to_dict(), sort_keys=True) == snap["schema"])


def _one_case(pristine, work, seed: int) -> str:
    root, snap = pristine
    rng = np.random.default_rng(seed)
    copy = work
    what = _damage(copy, rng)
    rep = validate(copy, check_values=False)   # never raises: problems are in the report
    try:
        summary(copy)                          # `dataset info`
        s = TrajectoryStore.open(copy)
        data = s.load()
        read = "ok" if _same(snap, s, data) else "WRONG"
    except (ValueError, FileNotFoundError) as err:
        read = "refused"
        assert "\n" not in str(err).strip() or str(err).count("\n") < 2, f"{what}: not a one-line error: {err}"
    assert read != "WRONG", f"seed {seed}: {what}: a read returned different data without an error"
    assert not (rep.ok and read == "refused"), f"seed {seed}: {what}: readers refuse what validate passes"
    _restore(root, copy)
    return f"{read} {'ok' if rep.ok else 'flagged'}"


def _restore(root, work) -> None:
    """Put the working copy back to the pristine store (cheaper than a fresh copy per case)."""
    want = {p.relative_to(root): p for p in _files(root)}
    for p in _files(work):
        if p.relative_to(work) not in want:
            p.unlink()
    for rel, src in want.items():
        dst = work / rel
        data = src.read_bytes()
        if not dst.is_file() or dst.read_bytes() != data:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)


def _run(pristine, tmp_path, seeds) -> dict:
    outcomes: dict[str, int] = {}
    work = tmp_path / "work"
    shutil.copytree(pristine[0], work)
    for seed in seeds:
        o = _one_case(pristine, work, seed)
        outcomes[o] = outcomes.get(o, 0) + 1
    return outcomes


def test_fuzz_damaged_stores(pristine, tmp_path):
    outcomes = _run(pristine, tmp_path, range(FUZZ_CASES))
    assert sum(outcomes.values()) == FUZZ_CASES
    assert outcomes.get("refused flagged", 0) > FUZZ_CASES // 2, outcomes   # most damage matters


@pytest.mark.slow
def test_fuzz_damaged_stores_many(pristine, tmp_path):
    outcomes = _run(pristine, tmp_path, range(FUZZ_CASES, FUZZ_CASES + FUZZ_CASES_SLOW))
    assert sum(outcomes.values()) == FUZZ_CASES_SLOW
    print(outcomes)
