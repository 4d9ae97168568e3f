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


def test_eval_quard_swapped_instructions_measures_instruction_following(tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--task", "quard:distinguish", "--policy", "quard_expert", "--colours", "train",
                 "--instructions", "original,swapped", "--episodes-per-cell", "1", "--num-envs", "1",
                 "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    original, swapped = result["families"]["train"]["distinguish"], result["swapped"]["train"]["distinguish"]
    assert swapped["episodes"] == 1 and swapped["follows"] == swapped["success"]
    assert swapped["to_original"] == swapped["outcomes"].get("wrong_target", 0)
    assert "follows" not in original and result["overall"]["episodes"] == 1
    assert original["scenes"] == swapped["scenes"] == [[0, 1]]   # env 0's first episode after the reset, in both
    follow = result["instruction_following"]
    assert follow["episodes"] == 1 and follow["follows"] == swapped["follows"]
    assert follow["follows"] == 1.0          # the privileged expert reads the swapped target
    assert swapped["named_share"] == follow["named_share"] == 1.0
    report = (out / "report.md").read_text()
    assert "| swapped | train | distinguish | 1 |" in report and "instruction following" in report
    assert (out / "frames_distinguish_train_swapped.png").stat().st_size > 0


def test_eval_refuses_bad_instruction_sets(tmp_path, capsys):
    assert main(["eval", "--task", "quard:go_to", "--instructions", "reversed", "--out", str(tmp_path / "e")]) == 2
    assert "reversed" in capsys.readouterr().err
    assert main(["eval", "--instructions", "swapped", "--out", str(tmp_path / "f")]) == 2
    assert "quard" in capsys.readouterr().err


def test_flags_of_the_other_evaluation_are_refused_not_dropped(tmp_path, capsys):
    """A flag that the chosen evaluation would ignore is a one-line error before anything runs (a locomotion
    policy asked for on a QUARD task was once swapped for the task's expert without a word)."""
    quard = ["eval", "--task", "quard:go_to", "--out", str(tmp_path / "e")]
    for extra, said in ((["--terrain", "stairs_up"], "--terrain: the terrain sweep's flags"),
                        (["--levels", "0-3", "--video"], "--levels, --video: the terrain sweep's flags")):
        assert main(quard + extra) == 2
        assert said in capsys.readouterr().err
    assert main(["eval", "--colours", "held_out", "--out", str(tmp_path / "f")]) == 2
    assert "--colours held_out: colour sets apply to --task quard:... only" in capsys.readouterr().err
    assert main(["eval-expert", "--task", "quard:go_to", "--out", str(tmp_path / "g")]) == 2
    assert "eval-expert sweeps the locomotion terrains" in capsys.readouterr().err
    assert main(["eval-expert", "--policy", "gait", "--out", str(tmp_path / "h")]) == 2
    assert "--experts" in capsys.readouterr().err
    assert main(["eval-expert", "--experts", "nosuch", "--out", str(tmp_path / "i")]) == 2
    assert "--experts 'nosuch' is unknown" in capsys.readouterr().err
    assert main(["eval", "--episodes-per-cell", "0", "--out", str(tmp_path / "j")]) == 2
    assert "--episodes-per-cell=0 is invalid" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_policy_given_for_a_quard_task_is_the_one_evaluated(monkeypatch, tmp_path):
    import quadforge.evaluation.evaluate_task as et
    seen = []
    monkeypatch.setattr(et, "evaluate_task", lambda cfg: seen.append(cfg.policy) or {})
    monkeypatch.setattr(et, "write_task_outputs", lambda result, out: {"report": "r", "json": "j"})
    for given, used in ((["--policy", "gait"], "gait"), ([], "quard_expert")):
        assert main(["eval", "--task", "quard:go_to", *given, "--out", str(tmp_path / "e")]) == 0
        assert seen.pop() == used


@pytest.mark.slow
def test_privileged_expert_follows_swapped_instructions_in_every_family(tmp_path):
    from quadforge.evaluation.evaluate_task import TaskEvalConfig, evaluate_task
    result = evaluate_task(TaskEvalConfig(task="quard:all", colours=("train",), instructions=("swapped",), episodes=2,
                                          num_envs=2, frames=False, out=str(tmp_path)), log=lambda _: None)
    assert result["overall"]["episodes"] == 0 and result["instruction_following"]["episodes"] == 10
    for family, row in result["swapped"]["train"].items():
        assert row["follows"] >= 0.5 and row["to_original"] == 0.0, (family, row["outcomes"])
    assert result["instruction_following"]["follows"] >= 0.9


def test_eval_quard_runs_on_the_backend_it_is_given(tmp_path, monkeypatch):
    # `eval --task quard:* --backend B` must build its envs on B (it silently ran on mujoco_cpu before);
    # a backend without the task's capabilities is named before any episode runs
    from quadforge.envs import backends
    from quadforge.evaluation.evaluate_task import TaskEvalConfig, evaluate_task
    monkeypatch.setattr(backends, "BACKENDS", dict(backends.BACKENDS))
    backends.register_backend(backends.BackendSpec("bare", "quadforge.envs.backends.mujoco_cpu:MujocoCpuBackend",
                                                   "mujoco_cpu declaring no capabilities"))
    cfg = TaskEvalConfig(task="quard:go_to", colours=("train",), episodes=1, num_envs=1, out=str(tmp_path),
                         backend="bare")
    with pytest.raises(NotImplementedError, match="backend 'bare' lacks"):
        evaluate_task(cfg)


def test_the_held_out_colour_test_pools_only_the_families_that_name_a_colour():
    """distinguish (letters) and go_avoid (objects) name no colour: held-out colours only re-tint their
    scenes, so the held-out-colour figure pools go_to, stop and go_through."""
    from quadforge.envs.quard.families import family_names, get_family
    from quadforge.evaluation.evaluate_task import held_out_colour_words
    assert {f: get_family(f).names_colour for f in family_names()} == {
        "go_to": True, "go_avoid": False, "stop": True, "distinguish": False, "go_through": True}
    rows = {f: {"episodes": 10, "success": s} for f, s in
            (("go_to", 0.9), ("go_avoid", 0.1), ("stop", 0.7), ("distinguish", 1.0), ("go_through", 0.5))}
    words = held_out_colour_words({"train": rows, "held_out": rows})
    assert words["families"] == ["go_to", "stop", "go_through"] and words["episodes"] == 30
    assert abs(words["success"] - 0.7) < 1e-12
    assert held_out_colour_words({"train": rows}) is None
