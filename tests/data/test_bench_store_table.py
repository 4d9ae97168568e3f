"""`bench store`'s last table: runs of compactions onto stores whose episode tables grow."""
from quadforge.data.store import TrajectoryStore
from quadforge.tools.bench.store import _table_growth


def test_table_growth_times_runs_of_compactions_and_counts_the_tables_files(tmp_path):
    table = _table_growth(tmp_path, quick=True, sizes=(20, 400), runs=3)
    rows = table.records()
    assert [r["table episodes"] for r in rows] == [20, 400]
    for r in rows:
        assert 0 < r["median wall s"] <= r["max wall s"] and r["table MB"] > 0
    store = TrajectoryStore.open(tmp_path / "table_growth")
    assert store.num_episodes == 400 + 3 * 50 and rows[-1]["table files"] == len(store.table_files)
