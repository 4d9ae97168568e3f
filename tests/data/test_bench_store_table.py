"""`bench store`'s last table: runs of compactions onto stores whose episode tables grow."""
from quadforge.data.store import TrajectoryStore
from quadforge.tools.bench.store import _table_growth, _table_open


def test_table_growth_times_runs_of_compactions_and_counts_the_tables_files(tmp_path):
    table = _table_growth(tmp_path, quick=True, sizes=(20, 400), runs=3)
    rows = table.records()
    assert [r["table episodes"] for r in rows] == [20, 400]
    for r in rows:
        assert 0 < r["median wall s"] <= r["max wall s"] and r["table MB"] > 0
    store = TrajectoryStore.open(tmp_path / "table_growth")
    assert store.num_episodes == 400 + 3 * 50 and rows[-1]["table files"] == len(store.table_files)


def test_table_open_times_both_reads_of_the_same_table(tmp_path):
    _table_growth(tmp_path, quick=True, sizes=(200,), runs=1)
    rows = {r["read"].strip(): r for r in _table_open(tmp_path / "table_growth", rounds=2).records()}
    eager, deferred = rows["all columns decoded"], rows["dict columns deferred"]
    assert eager["/ all decoded"] == 1 and eager["ms per 1k rows"] > 0 and deferred["ms per 1k rows"] > 0
    # what the deferred table holds is its typed columns (the text stays in the file): less than the dicts
    assert 0 < deferred["heap B per row"] < eager["heap B per row"]
    # a child process's resident growth (at 200 rows it is mostly the allocator's pages: not compared here)
    assert all(r["RSS B per row"] >= 0 for r in (eager, deferred))
    assert rows["then its first read of the dict columns"]["ms per 1k rows"] > 0
