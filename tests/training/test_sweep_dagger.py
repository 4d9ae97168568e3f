"""`quadforge train-sweep` (equal-budget tuning) and `quadforge dagger` (expert relabelling), shrunk."""
import json

import numpy as np
import pytest
import torch

from quadforge.tools.cli import build_parser, main as cli_main
from quadforge.data.store_set import concat_episodes
from quadforge.training.dagger import DaggerConfig, run_dagger
from quadforge.training.sweep import LION_LR_RATIO, SETTINGS, SweepConfig, run_config, sweep_models

from imitation_data import learnable_arrays

torch.set_num_threads(1)


def _store(path, episodes=8):
    from quadforge.data.compaction import compact
    from quadforge.data.writer import StagingWriter
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    rng = np.random.default_rng(0)
    writer = StagingWriter(path, "c0")
    for i in range(episodes):
        writer.write_episode(synthetic_episode(rng, 20, success=True), synthetic_info(i, success=True))
    compact(path)
    return path


def test_every_model_gets_the_same_grid_and_two_paper_settings(tmp_path):
    assert set(SETTINGS) == set(sweep_models())
    cfg = SweepConfig(data=str(_store(tmp_path / "s")), out=str(tmp_path / "o"), steps=7).validate()
    for model in sweep_models():
        key, values, why = SETTINGS[model]
        assert len(values) == 2 and why
        for opt in ("adamw", "lion"):
            t = run_config(model, cfg, 1e-3, opt)
            assert (t.optim.name, t.optim.lr, t.max_steps, t.batch_size, t.seed) == (opt, 1e-3, 7, 64, 0)
        t = run_config(model, cfg, 1e-3, "adamw", (key, values[0]))
        got = t.model_config[key.split(".", 1)[1]] if key.startswith("model.") else getattr(t, key)
        assert got == values[0]


def test_sweep_runs_resumes_and_tabulates(tmp_path, capsys):
    store = _store(tmp_path / "s")
    argv = ["train-sweep", "--store", str(store), "--out", str(tmp_path / "o"), "--models", "mlp", "--steps", "2",
            "--batch-size", "8", "--lrs", "1e-3", "--table", str(tmp_path / "t.md")]
    assert cli_main(argv) == 0
    res = json.loads((tmp_path / "o" / "sweep.json").read_text())
    assert len(res["runs"]) == 2 + 2                       # adamw + lion, then the two context settings
    lion = [r for r in res["runs"].values() if r["optimizer"] == "lion"]
    assert lion[0]["lr"] == pytest.approx(1e-3 / LION_LR_RATIO)
    chosen = res["chosen"]["mlp"]
    stage1 = min(r["val_loss"] for r in res["runs"].values() if r["stage"] == 1)
    stage2 = [r["val_loss"] for r in res["runs"].values() if r["stage"] == 2 and r["val_loss"] < 0.95 * stage1]
    assert chosen["val_loss"] == min([stage1] + stage2)    # a paper setting only when > 5 % better
    table = (tmp_path / "t.md").read_text()
    assert table.startswith("| model |") and "| mlp |" in table and "context=16" in table
    capsys.readouterr()
    assert cli_main(argv) == 0                             # resumes: nothing retrained
    said = capsys.readouterr().out
    assert "train mlp" not in said and "[sweep] resuming" in said and "run(s) already done are kept" in said


def test_sweep_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="--models"):
        SweepConfig(data=str(tmp_path), out=str(tmp_path), models=("gpt",)).validate()
    with pytest.raises(FileNotFoundError, match="--episodes"):
        SweepConfig(data=str(tmp_path / "none"), out=str(tmp_path)).validate()
    (tmp_path / "store.txt").write_text("x")
    with pytest.raises(ValueError, match=r"--store .*store\.txt: is a file, not a trajectory store folder"):
        SweepConfig(data=str(tmp_path / "store.txt"), out=str(tmp_path / "out")).validate()


def test_concat_keeps_episode_boundaries():
    a, b = learnable_arrays(3, seed=0), learnable_arrays(2, seed=1)
    c = concat_episodes([a, b])
    assert c.num_episodes == 5 and c.num_steps == a.num_steps + b.num_steps
    assert np.array_equal(c.episode_lengths, np.concatenate([a.episode_lengths, b.episode_lengths]))
    assert np.array_equal(c.features["actions"][a.num_steps:], b.features["actions"])


def test_dagger_relabels_the_learners_states_and_keeps_a_ladder(tmp_path, capsys):
    # ram_budget=1K: every iteration trains out of core, iteration 1 on the expert's and the relabelled
    # store joined per batch (tests/data/test_out_of_core.py: the same batches and weights as the RAM path)
    from quadforge.data.store import TrajectoryStore
    cfg = DaggerConfig(out=str(tmp_path / "d"), expert_episodes=4, num_envs=2, train_steps=3, batch_size=8,
                       iterations=1, episodes_per_iter=2, finetune_steps=2, eval_terrain="flat",
                       eval_levels="0", eval_episodes=1, max_episode_s=0.4, overrides=["ram_budget=1K"])
    lines = []
    res = run_dagger(cfg, log=lines.append)
    assert [r["iteration"] for r in res["ladder"]] == [0, 1]
    first, second = res["ladder"]
    assert second["relabelled_episodes"] == 2 and second["init_from"] == first["checkpoint"]
    assert second["data_episodes"] == first["data_episodes"] + 2
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: ")]
    assert len(said) == 2 and all(line.startswith("data: out-of-core path") for line in said)
    assert f"{tmp_path / 'd' / 'relabelled'}/shards" in said[1] and "(2 store(s))" in "\n".join(lines)
    assert 0.0 <= second["success"] <= 1.0 and 0.0 <= res["expert_eval"]["success"] <= 1.0
    store = TrajectoryStore.open(str(tmp_path / "d" / "relabelled"))
    feats = store.load(["actions", "applied_actions"])
    assert not np.allclose(feats["actions"], feats["applied_actions"])   # labels are the expert's, not the driver's
    driven = second["driver_success_while_collecting"]
    ours = np.char.startswith(np.asarray(store.episodes["episode_id"]).astype(str), "dagger1-")
    assert ours.sum() == 2 and driven == float(np.asarray(store.episodes["success"])[ours].mean())
    # a rerun whose iteration 1 was interrupted after its collection: nothing left to collect, and the
    # driver's success still read (from the store; the rerun's collect summary has no run: it was None)
    path = tmp_path / "d" / "dagger.json"
    saved = json.loads(path.read_text())
    saved["ladder"] = saved["ladder"][:1]
    path.write_text(json.dumps(saved))
    again = run_dagger(cfg, log=lines.append)["ladder"][1]
    assert again["driver_success_while_collecting"] == driven and again["relabelled_episodes"] == 2
    with pytest.raises(ValueError, match="control"):
        DaggerConfig(out=str(tmp_path / "x"), episodes_per_iter=0, iterations=1).validate()


def test_dagger_passes_ram_budget_to_its_trainer(tmp_path):
    from quadforge.training.dagger import iteration_train_config
    cfg = DaggerConfig(out=str(tmp_path / "d"), data=str(_store(tmp_path / "s")), overrides=["ram_budget=1K"])
    assert iteration_train_config(cfg, 0, None).ram_budget == "1K"     # `quadforge dagger ... ram_budget=SIZE`
    assert iteration_train_config(cfg, 1, None).ram_budget == "1K"


def _refused(argv, capsys, *words):
    """``quadforge ARGV`` ends in rc 2 and one error line holding ``words``."""
    capsys.readouterr()
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    return err


def test_out_is_checked_before_any_work(tmp_path, capsys):
    # --out an existing file, or a folder of the user's that is not this command's output: refused, untouched
    store = _store(tmp_path / "s")
    afile, notes = tmp_path / "afile.txt", tmp_path / "other2" / "notes.txt"
    afile.write_text("mine")
    notes.parent.mkdir()
    notes.write_text("my notes")
    for out in (afile, notes.parent):
        _refused(["dagger", "--out", str(out), "--store", str(store)], capsys, "--out", str(out))
        _refused(["train-sweep", "--store", str(store), "--out", str(out), "--steps", "1"], capsys, "--out", str(out))
    assert afile.read_text() == "mine" and notes.read_text() == "my notes"
    assert sorted(p.name for p in notes.parent.iterdir()) == ["notes.txt"]


def test_sweep_checks_table_before_the_sweep(tmp_path, capsys):
    (tmp_path / "emptydir").mkdir()
    _refused(["train-sweep", "--store", str(_store(tmp_path / "s")), "--out", str(tmp_path / "o"), "--steps", "1",
              "--table", str(tmp_path / "emptydir")], capsys, "--table", "emptydir")
    assert not (tmp_path / "o").exists() and not any((tmp_path / "emptydir").iterdir())


def test_sweep_rerun_with_other_options_is_refused(tmp_path, capsys):
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b", episodes=6)
    argv = ["train-sweep", "--out", str(tmp_path / "o"), "--models", "mlp", "--steps", "1", "--batch-size", "8",
            "--lrs", "1e-3", "--optimizers", "adamw"]
    assert cli_main(argv + ["--store", str(a)]) == 0
    before = (tmp_path / "o" / "sweep.json").read_text()
    _refused(argv + ["--store", str(b)], capsys, "--out", "--store", str(b), "new --out")
    _refused(argv + ["--store", str(a), "--seed", "1"], capsys, "--seed")
    assert (tmp_path / "o" / "sweep.json").read_text() == before
    for _ in range(2):   # same runs: resumes; and a rerun replaces its own table, whatever its name
        assert cli_main(argv + ["--store", str(a), "--table", str(tmp_path / "t.txt")]) == 0
        assert "train mlp" not in capsys.readouterr().out and (tmp_path / "t.txt").is_file()


def test_dagger_rerun_with_other_options_is_refused_and_the_same_resumes(tmp_path, capsys):
    out = tmp_path / "dg2"
    argv = ["dagger", "--out", str(out), "--expert-episodes", "4", "--iterations", "0", "--train-steps", "2",
            "--episodes-per-cell", "1", "--batch-size", "8"]
    assert cli_main(argv + ["--model", "mlp"]) == 0
    first = capsys.readouterr().out.strip().splitlines()[-1]
    before = (out / "dagger.json").read_text()
    _refused(argv + ["--model", "transformer"], capsys, f"--out {out}", "--model 'mlp' there, 'transformer' now",
             "new --out")
    assert (out / "dagger.json").read_text() == before and not (out / "iter0" / "transformer").exists()
    assert cli_main(argv + ["--model", "mlp", "--iterations", "0"]) == 0          # the same options: resumes
    said = capsys.readouterr().out
    assert "training" not in said and "evaluating" not in said and said.strip().splitlines()[-1] == first
    assert "[dagger] resuming" in said and "iteration(s) 0-0 done and kept, 0 to go" in said
    assert json.loads((out / "dagger.json").read_text())["config"]["model"] == "mlp"


def test_dagger_checks_its_options_before_collecting(tmp_path, capsys):
    (tmp_path / "afile.txt").write_text("not a checkpoint")
    out = tmp_path / "d"
    for extra, words in [(["--model", "nosuch"], ["--model", "nosuch", "allowed"]),
                         (["--preset", "nosuch"], ["--preset", "nosuch", "allowed"]),
                         (["nosuch=1"], ["override", "nosuch"]),
                         (["model.hiden=3"], ["hiden"]),
                         (["--init-from", str(tmp_path / "afile.txt")], ["--init-from", "not a quadforge"]),
                         (["--init-from", str(tmp_path / "none.pt")], ["--init-from", "does not exist"]),
                         (["--store", str(tmp_path / "afile.txt")], ["--store", "afile.txt"]),
                         (["--store", str(tmp_path)], ["--store", "not a trajectory store"])]:
        _refused(["dagger", "--out", str(out), *extra], capsys, *words)
        assert not out.exists()                                    # nothing collected, nothing created


def test_dagger_checkpoint_of_another_model_is_refused_when_fine_tuned_from(tmp_path, capsys):
    from quadforge.training.imitation import train
    from quadforge.training.presets import preset
    t = preset("mlp", "cpu")
    t.max_steps, t.batch_size, t.tensorboard = 1, 8, False
    ckpt = train(t, str(_store(tmp_path / "s")), tmp_path / "run").checkpoint
    _refused(["dagger", "--out", str(tmp_path / "d"), "--init-from", str(ckpt), "--finetune-steps", "2"], capsys,
             "--init-from", "'mlp', not 'fcnet'")
    assert not (tmp_path / "d").exists()


def test_dagger_refuses_a_model_that_would_read_the_labels_as_its_previous_actions(capsys, tmp_path):
    out = str(tmp_path / "d")
    _refused(["dagger", "--out", out, "--model", "starformer"], capsys, "reads its previous actions")
    assert not (tmp_path / "d").exists()


def test_dagger_errors_name_the_flag_passed(capsys, tmp_path):
    out = str(tmp_path / "d")
    _refused(["dagger", "--out", out, "--episodes-per-cell", "0"], capsys, "--episodes-per-cell=0")
    err = _refused(["dagger", "--out", out, "--iterations", "-1"], capsys, "--iterations=-1")
    assert "--finetune-steps" not in err and "--episodes-per-iter" not in err
    _refused(["dagger", "--out", out, "--finetune-steps", "-1"], capsys, "--finetune-steps=-1")


def test_dagger_collects_with_the_compiled_expert_when_asked(tmp_path, monkeypatch):
    from quadforge.training import dagger

    class Collected(Exception):
        pass
    seen = []

    def run_local(cfg):
        seen.append(cfg)
        raise Collected
    monkeypatch.setattr(dagger, "run_local", run_local)
    args = build_parser(with_subcommand="dagger").parse_args(["dagger", "--out", str(tmp_path / "d"), "--compile-expert"])
    with pytest.raises(Collected):
        dagger.run(args)
    assert seen[0].compile_expert and seen[0].policy == "gait"


def test_a_dagger_ladder_recorded_before_an_option_existed_resumes_with_its_default(tmp_path):
    from dataclasses import asdict
    cfg = DaggerConfig(out=str(tmp_path / "d"))
    older = {k: v for k, v in asdict(cfg).items() if k != "compile_expert"}
    cfg.check_resume(older)                                   # made eagerly, as it would be now
    with pytest.raises(ValueError, match="--compile-expert False there, True now"):
        DaggerConfig(out=str(tmp_path / "d"), compile_expert=True).check_resume(older)
