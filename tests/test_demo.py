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
    assert (out / "eval" / "experts_success_vs_level.png").stat().st_size > 0


def test_demo_bad_out_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert cli_main(["demo", "--tiny", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
