"""`bench out_of_core` runs end to end on tiny stores and reports both paths and the issue's bars."""
import json

import pytest

import quadforge.tools.bench.out_of_core as bench


@pytest.mark.slow   # twelve fresh processes (each its own peak RSS): about 4 minutes on 2 shared cores
def test_out_of_core_bench_reports_both_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "QUICK", (6_000, 12_000, 3, 3))
    assert bench.main(quick=True, json_path=str(tmp_path / "ooc.json")) == 0
    record = json.loads((tmp_path / "ooc.json").read_text())
    rows = next(v for k, v in record["tables"].items() if k.startswith("window sampling"))
    assert {(r["store steps"], r["path"], r["what"]) for r in rows} == {
        (6000, "RAM", "sampler"), (6000, "RAM", "FCNet training"), (6000, "out-of-core", "sampler"),
        (6000, "out-of-core", "FCNet training"), (12000, "out-of-core", "sampler"),
        (12000, "out-of-core", "FCNet training")}
    assert all(r["windows/s"] > 0 and r["peak RSS GB"] > 0 for r in rows)
    assert record["raw"]["fits/out-of-core/sample"]["path"] == "out-of-core"
    assert record["raw"]["fits/RAM/sample"]["path"] == "RAM"
    dagger = next(v for k, v in record["tables"].items() if k.startswith("DAgger's aggregate"))
    assert {(r["aggregate steps"], r["path"], r["what"]) for r in dagger} == {
        ("6,000 + 3,000", "RAM", "sampler"), ("6,000 + 3,000", "RAM", "FCNet training"),
        ("6,000 + 3,000", "out-of-core", "sampler"), ("6,000 + 3,000", "out-of-core", "FCNet training"),
        ("12,000 + 3,000", "out-of-core", "sampler"), ("12,000 + 3,000", "out-of-core", "FCNet training")}
    assert all(r["windows/s"] > 0 for r in dagger)
    assert record["raw"]["dagger/fits/out-of-core/sample"]["path"] == "out-of-core"
    assert record["raw"]["dagger/fits/RAM/sample"]["path"] == "RAM"
    assert record["raw"]["dagger/large/out-of-core/sample"]["steps"] == 15_000      # the two stores as one
    bars = record["tables"]["issue 28 bars (same run)"]
    assert len(bars) == 9 and all(isinstance(b["met"], bool) for b in bars)
    assert not (tmp_path / "runs" / "bench_out_of_core").exists()     # its stores deleted at the end
