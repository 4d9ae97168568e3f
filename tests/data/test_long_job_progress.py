"""The store's long jobs (`dataset compact | validate | export-hdf5 | export-lerobot`) show a bar that runs to its
total; the library calls stay quiet unless asked (a collection's compactions run under its own progress line)."""
import pytest

import quadforge.data.compaction
import quadforge.data.export
import quadforge.data.export_lerobot
import quadforge.data.validate
from quadforge.data.compaction import compact
from quadforge.data.export import export_hdf5
from quadforge.data.store import TrajectoryStore
from quadforge.data.validate import validate


class _Bar:
    """What the jobs use of a tqdm bar, counting (a disabled tqdm counts nothing)."""

    def __init__(self, total, iterable=None):
        self.total, self.n, self.iterable, self.updates = total, 0, iterable, 0

    def update(self, k=1):
        self.n += k
        self.updates += 1

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.n += 1


@pytest.fixture
def bars(monkeypatch):
    made = []

    def recording(total, initial=0, desc="", unit="step", enabled=True, iterable=None, **kwargs):
        bar = _Bar(total, iterable)
        made.append((desc, total, enabled, bar))
        return bar
    for module in (quadforge.data.compaction, quadforge.data.validate, quadforge.data.export,
                   quadforge.data.export_lerobot):
        monkeypatch.setattr(module, "progress_bar", recording)
    return made


def _finished(bars, desc):
    [(_, total, enabled, bar)] = [b for b in bars if b[0] == desc]
    return enabled, total, bar.n


def test_compact_validate_and_export_bars_run_to_their_totals(tmp_path, write_episodes, bars):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=4, seed=0)
    compact(store, progress=True)
    assert _finished(bars, "compact") == (True, 4, 4)
    rep = validate(store, check_values=True, progress=True)
    enabled, total, done = _finished(bars, "validate")
    assert rep.ok and enabled and total > 0 and done == total
    # it moves while a feature's chunks are read, not only once each feature is done
    [validate_bar] = [b for d, _, _, b in bars if d == "validate"]
    assert validate_bar.updates > len(TrajectoryStore.open(store).schema.features)   # one catch-up per feature
    export_hdf5(store, tmp_path / "x.h5", progress=True)
    assert _finished(bars, "export-hdf5") == (True, 4, 4)


def test_a_damaged_feature_still_brings_the_validate_bar_to_its_end(tmp_path, write_episodes, bars):
    store = tmp_path / "s"
    write_episodes(store, "c0", n=3, seed=1)
    compact(store)
    assert _finished(bars, "compact")[0] is False          # a library compaction stays quiet
    chunk = next(p for p in (store / "data" / "actions").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.unlink()                                          # that feature's data checks are skipped
    rep = validate(store, progress=True)
    enabled, total, done = _finished(bars, "validate")
    assert not rep.ok and done == total


def test_export_lerobot_bar(tmp_path, write_episodes, bars):
    pytest.importorskip("pyarrow")
    from quadforge.data.export_lerobot import export_lerobot
    store = tmp_path / "s"
    write_episodes(store, "c0", n=3, seed=2)
    compact(store)
    export_lerobot(store, tmp_path / "lr", progress=True)
    assert _finished(bars, "export-lerobot") == (True, 3, 3)
