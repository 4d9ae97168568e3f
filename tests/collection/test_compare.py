"""`quadforge compare`: finished evaluations side by side per cell, Fisher's exact p, Holm's correction."""
import json

import pytest

from quadforge.evaluation.compare import compare, evaluation_files, load_evaluation
from quadforge.evaluation.metrics import fisher_exact_p, holm_significant
from quadforge.output_paths import table_marker
from quadforge.tools.cli import main


def test_fisher_exact_p_matches_known_tables_and_is_symmetric():
    assert fisher_exact_p(8, 8, 4, 8) == pytest.approx(1 / 13)           # 8/8 vs 4/8: p = 0.0769
    assert fisher_exact_p(1, 10, 9, 10) == pytest.approx(0.0010933, rel=1e-4)
    assert fisher_exact_p(3, 10, 3, 10) == 1.0
    assert fisher_exact_p(2, 9, 7, 11) == pytest.approx(fisher_exact_p(7, 11, 2, 9))
    assert fisher_exact_p(0, 0, 3, 5) == 1.0
    with pytest.raises(ValueError, match="successes must lie"):
        fisher_exact_p(5, 4, 1, 4)


def test_holm_stops_at_the_first_test_that_fails_its_threshold():
    # sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: the last two fail although each is below 0.05
    assert holm_significant([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm_significant([]) == []


def _cell(terrain, level, k, n):
    return {"command_set": "walking", "terrain_type": terrain, "terrain_level": level, "episodes": n,
            "success": k / n}


def _locomotion(path, policy_id, cells, **config):
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"policy": policy_id, "out": str(path), "robot": "go1", "terrain": "flat,stairs_up", "levels": "0-1",
           "episodes": 20, "seed": 0, **config}
    (path / "eval.json").write_text(json.dumps({"policy": policy_id, "policy_id": policy_id, "config": cfg,
                                                "cells": [_cell(*c) for c in cells]}))
    return path


def test_compare_pools_common_cells_and_stars_only_what_survives_holm(tmp_path, capsys):
    a = _locomotion(tmp_path / "a", "expert", [("flat", 0, 20, 20), ("flat", 1, 19, 20), ("stairs_up", 0, 18, 20)])
    b = _locomotion(tmp_path / "b", "fcnet", [("flat", 0, 5, 20), ("flat", 1, 16, 20), ("stairs_up", 1, 9, 20)],
                    seed=3)
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b / "eval.json"), "--labels", "E,F", "--json", str(out),
                 "--table", str(tmp_path / "cmp.md")]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["labels"] == ["E", "F"] and result["kind"] == "locomotion"
    assert result["pooled"] == {"cells": 2, "results": [[39, 40], [21, 40]]}      # flat 0 and 1 only
    rows = {tuple(r["cell"]): r for r in result["rows"]}
    flat0, flat1 = rows[("walking", "flat", 0)]["versus"][0], rows[("walking", "flat", 1)]["versus"][0]
    assert flat0["difference"] == pytest.approx(-0.75) and flat0["p"] == pytest.approx(fisher_exact_p(5, 20, 20, 20))
    assert flat0["significant"] and not flat1["significant"]
    # a cell only one policy has is shown, not tested
    assert rows[("walking", "stairs_up", 0)]["results"][1] is None and rows[("walking", "stairs_up", 0)]["versus"] == [None]
    assert result["different_settings"] == {"seed": [0, 3]}
    assert "not like for like: `seed`" in printed and "| walking | flat | 0 | 20/20 (1) | 5/20 (0.25) | -0.750 * |" in printed
    assert (tmp_path / "cmp.md").read_text() == printed + "\n" + table_marker("compare") + "\n"
    # a rerun replaces its own table; a user's text (notes.md) is no table of compare's, whatever its name
    assert main(["compare", str(a), str(b), "--table", str(tmp_path / "cmp.md")]) == 0
    notes = tmp_path / "notes.md"
    notes.write_text("# My thesis notes\n")
    assert main(["compare", str(a), str(b), "--table", str(notes)]) == 2
    assert "not an earlier output" in capsys.readouterr().err and notes.read_text() == "# My thesis notes\n"


def test_an_eval_expert_folder_expands_to_its_policies_in_order(tmp_path):
    root = tmp_path / "experts"
    for k, name in ((10, "z"), (2, "b"), (0, "gait")):
        _locomotion(root / f"{k}_{name}", name, [("flat", 0, 3, 4)])
    assert [f.parent.name for f in evaluation_files(str(root))] == ["0_gait", "2_b", "10_z"]
    with pytest.raises(ValueError, match="holds no eval.json"):
        evaluation_files(str(tmp_path))


def test_quard_evaluations_compare_per_instruction_set_colour_and_family(tmp_path):
    def quard(name, k):
        row = lambda s: {"episodes": 10, "success": s / 10}  # noqa: E731
        p = tmp_path / name / "eval.json"
        p.parent.mkdir()
        p.write_text(json.dumps({"policy_id": name, "config": {"task": "quard:all"},
                                 "families": {"train": {"go_to": row(k), "stop": row(10)}},
                                 "swapped": {"train": {"go_to": row(k // 2)}}}))
        return load_evaluation(p)
    result = compare([quard("expert", 10), quard("vla", 4)])
    assert result["cell_columns"] == ["instructions", "colours", "family"]
    assert [r["cell"] for r in result["rows"]] == [["original", "train", "go_to"], ["original", "train", "stop"],
                                                  ["swapped", "train", "go_to"]]
    assert result["pooled"]["results"] == [[25, 30], [16, 30]]


def test_bad_inputs_are_one_line_errors(tmp_path, capsys):
    a = _locomotion(tmp_path / "a", "expert", [("flat", 0, 3, 4)])
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    q = tmp_path / "q" / "eval.json"
    q.parent.mkdir()
    q.write_text(json.dumps({"policy_id": "v", "families": {"train": {"stop": {"episodes": 4, "success": 1.0}}}}))
    cases = [([str(a)], "at least two"), ([str(a), str(tmp_path / "nope")], "no such file"),
             ([str(a), str(tmp_path / "notes.json")], "not an evaluation result"),
             ([str(a), str(q)], "measure different things"),
             ([str(a), str(a), "--labels", "x"], "1 names for 2 evaluations"),
             ([str(a), str(a)], "labels .* repeat")]
    for argv, message in cases:
        assert main(["compare", *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and __import__("re").search(message, err), (argv, err)
