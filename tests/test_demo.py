"""The demo end to end, shrunk (``--tiny``): collect -> train FCNet -> evaluate both -> report."""
from __future__ import annotations

import json

import torch

from quadforge.tools.cli import main as cli_main

torch.set_num_threads(1)


def test_tiny_demo_runs_every_stage(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli_main(["demo", "--tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[1/3]" in printed and "[3/3]" in printed and "report:" in printed
    summary = json.loads((out / "demo_summary.json").read_text())
    assert summary["collected"]["in_store"] == 6
    assert (out / "fcnet" / "last.pt").exists()
    assert set(summary["overall"]) == {"gait expert", "FCNet"}
    for overall in summary["overall"].values():
        assert overall["episodes"] == 1 and 0.0 <= overall["success"] <= 1.0
    report = (out / "eval" / "expert_report.md").read_text()
    assert "FCNet" in report and "gait expert" in report
    # the FCNet row of each cell against the expert (quadforge compare's table), in the report and its JSON
    assert "## Against the first, per cell" in report and "| FCNet - gait expert | p |" in report
    versus = json.loads((out / "eval" / "expert_report.json").read_text())["versus_first"]
    assert versus["labels"] == ["gait expert", "FCNet"] and versus["pooled"]["results"][0][1] == 1
    assert (out / "eval" / "experts_success_vs_level.png").stat().st_size > 0


def test_demo_bad_out_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert cli_main(["demo", "--tiny", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_demo_rerun_with_other_options_is_refused(tmp_path, capsys, monkeypatch):
    """An interrupted (or finished) demo records its options before the work; a rerun into its folder with
    another --seed would reuse the seed-0 store and replace its model, so it is refused before any work."""
    import quadforge.collection.collect as collect

    def interrupted(cfg):
        raise KeyboardInterrupt
    monkeypatch.setattr(collect, "run_local", interrupted)
    out = tmp_path / "dm2"
    assert cli_main(["demo", "--tiny", "--out", str(out)]) == 130
    (out / "fcnet").mkdir()
    (out / "fcnet" / "best.pt").write_bytes(b"the seed-0 model")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert cli_main(["demo", "--tiny", "--out", str(out), "--seed", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out}" in err and "--seed 5 (earlier 0)" in err, err
    assert cli_main(["demo", "--out", str(out)]) == 2   # not --tiny: its sizes differ
    err = capsys.readouterr().err
    assert "--episodes 320 (earlier 6)" in err and "--tiny" in err, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert cli_main(["demo", "--tiny", "--out", str(out)]) == 130   # the same options: resumes (here: the stub)


def test_demo_rerun_checks_an_older_demos_summary(tmp_path, capsys):
    from quadforge.tools.demo import DemoConfig
    old = tmp_path / "old"   # a demo from before demo_options.json: its summary holds the config
    old.mkdir()
    (old / "demo_summary.json").write_text(json.dumps({"config": {"out": "x", **DemoConfig.tiny("x").options()}}))
    DemoConfig.tiny(str(old)).validate()
    assert cli_main(["demo", "--tiny", "--out", str(old), "--seed", "5"]) == 2
    assert "--seed 5 (earlier 0)" in capsys.readouterr().err
    bare = tmp_path / "bare"   # demo parts, no record of the options: nothing says a rerun matches
    (bare / "store").mkdir(parents=True)
    assert cli_main(["demo", "--tiny", "--out", str(bare)]) == 2
    assert f"--out {bare}: holds a demo whose options were not recorded" in capsys.readouterr().err
