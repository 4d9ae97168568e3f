"""`quadforge eval --task quard:...`: per-family success, failure reasons and frame strips."""
import json

import pytest

from quadforge.tools.cli import main

pytest.importorskip("quadforge.envs.quard.env")


def test_eval_quard_reports_per_family_and_colour_set_with_a_frame_strip(tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--task", "quard:go_to", "--policy", "quard_expert", "--colours", "held_out",
                 "--episodes-per-cell", "1", "--num-envs", "1", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    row = result["families"]["held_out"]["go_to"]
    assert row["episodes"] == 1 and sum(row["outcomes"].values()) == 1
    assert result["overall"]["episodes"] == 1 and 0.0 <= result["overall"]["success"] <= 1.0
    assert (out / "frames_go_to_held_out.png").stat().st_size > 0
    assert "| held_out | go_to | 1 |" in (out / "report.md").read_text()


def test_eval_quard_refuses_an_unknown_colour_set(tmp_path, capsys):
    assert main(["eval", "--task", "quard:go_to", "--colours", "neon", "--out", str(tmp_path / "e")]) == 2
    assert "neon" in capsys.readouterr().err
