"""Issue 13: outputs checked before work starts, finished work never replaced unasked, bad files and
mismatched robots a one-line error (each case reproduced from the issue)."""
import os

import numpy as np
import pytest
import torch

from quadforge.tools.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _store(path, n=6, robot="go1"):
    from quadforge.data.writer import StagingWriter
    from quadforge.data.compaction import compact
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    rng = np.random.default_rng(0)
    with StagingWriter(path, "c0") as w:
        for i in range(n):
            w.write_episode(synthetic_episode(rng, 20, success=True), {**synthetic_info(i, True), "robot": robot})
    compact(path)
    return path


def _train(store, out, *extra):
    return main(["train", "--model", "mlp", "--store", str(store), "--out", str(out), "--preset", "cpu",
                 "--max-steps", "2", "--batch-size", "8", "--val-every", "2", "model.hidden=8",
                 "tensorboard=False", *extra])


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_train_refuses_to_replace_a_finished_run(tmp_path, capsys):
    store, out = _store(tmp_path / "s"), tmp_path / "run"
    assert _train(store, out) == 0
    before = (out / "last.pt").read_bytes()
    assert _train(store, out, "--max-steps", "1") == 2
    _one_line_error(capsys, "already holds a training run", "--resume", "--overwrite")
    assert (out / "last.pt").read_bytes() == before            # untouched
    assert _train(store, out, "--resume", "--max-steps", "3") == 0
    assert _train(store, out, "--overwrite") == 0
    capsys.readouterr()
    assert _train(store, tmp_path / "fresh", "--resume") == 2
    _one_line_error(capsys, "holds no checkpoint")


def test_outputs_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# not a store")
    (tmp_path / "file").write_text("x")
    import quadforge.collection.collect as collect
    import quadforge.evaluation.evaluate as evaluate
    monkeypatch.setattr(collect, "build_env", lambda *a: pytest.fail("collect started work"))
    monkeypatch.setattr(evaluate, "build_env", lambda *a: pytest.fail("eval started work"))
    assert main(["collect", "--store", str(docs), "--episodes", "2"]) == 2
    _one_line_error(capsys, "not a trajectory store", "README.md")
    assert sorted(p.name for p in docs.iterdir()) == ["README.md"]
    assert main(["eval", "--out", str(tmp_path / "file" / "sub")]) == 2
    _one_line_error(capsys, "is a file, not a folder")
    assert main(["eval", "--out", str(docs)]) == 2
    _one_line_error(capsys, "not an evaluation report")
    store = _store(tmp_path / "s")
    assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(tmp_path / "file" / "x.h5")]) == 2
    _one_line_error(capsys, "is a file, not a folder")
    assert main(["bench", "store", "--quick", "--json", str(tmp_path / "file" / "b.json")]) == 2
    _one_line_error(capsys, "--json")


def test_import_hdf5_of_a_text_file_is_one_line(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# hello\n")
    assert main(["dataset", "import-hdf5", "--input", str(readme), "--store", str(tmp_path / "s")]) == 2
    _one_line_error(capsys, "not an HDF5 file")
    assert not (tmp_path / "s").exists()


def _bad_files(tmp_path):
    from quadforge.models.checkpoint import Checkpoint, save_checkpoint
    from quadforge.layout import get_layout
    good = save_checkpoint(tmp_path / "good.pt", Checkpoint("mlp", {"hidden": 4}, {"w": torch.zeros(3)},
                                                            get_layout("proprio").to_dict()))
    raw = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(raw[:len(raw) // 2])
    (tmp_path / "text.pt").write_text("a note, not a model\n")
    (tmp_path / "random.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "empty.pt").write_bytes(b"")
    return {"truncated.pt": "truncated", "text.pt": "a text file", "random.pt": "unknown binary content",
            "empty.pt": "an empty file"}


def test_damaged_checkpoints_are_one_line_errors(tmp_path):
    from quadforge.models.checkpoint import load_checkpoint
    from quadforge.experts.registry import load_policy
    from quadforge.experts.loaders import load_expert
    for name, what in _bad_files(tmp_path).items():
        for load in (load_checkpoint, lambda p: load_policy(p, num_envs=1), lambda p: load_expert(p)):
            with pytest.raises(ValueError) as err:
                load(tmp_path / name)
            msg = str(err.value)
            assert "\n" not in msg and name in msg and what in msg and "accepted:" in msg, msg


def test_train_expert_resume_with_an_fcnet_checkpoint(tmp_path):
    from quadforge.training.ppo import check_resume_checkpoint
    from quadforge.models.checkpoint import Checkpoint, save_checkpoint
    from quadforge.layout import get_layout
    p = save_checkpoint(tmp_path / "last.pt", Checkpoint("fcnet", {}, {"w": torch.zeros(1)},
                                                         get_layout("proprio").to_dict()))
    with pytest.raises(ValueError, match=r"--resume-from .*a quadforge train checkpoint \(model 'fcnet'\), not a PPO"):
        check_resume_checkpoint(str(p), "go1")
    ppo = os.path.join(REPO, "experts", "checkpoints", "go1_flat_forward_ppo.pt")
    check_resume_checkpoint(ppo, "go1")
    with pytest.raises(ValueError, match="trained for robot 'go1'"):
        check_resume_checkpoint(ppo, "aliengo")


def test_train_expert_refuses_an_existing_run_folder(tmp_path):
    from quadforge.training.ppo import TrainExpertConfig, train
    (tmp_path / "model_100.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds a PPO run"):
        train(TrainExpertConfig(out=str(tmp_path), iterations=1))


def test_checkpoint_records_its_robot_and_a_mismatch_is_refused(tmp_path, capsys):
    from quadforge.models.checkpoint import load_checkpoint
    from quadforge.experts.registry import load_policy
    store, out = _store(tmp_path / "s", robot="go1"), tmp_path / "run"
    assert _train(store, out) == 0
    assert load_checkpoint(out / "last.pt").provenance["robot"] == "go1"
    with pytest.raises(ValueError, match="trained on robot 'go1' data, asked to drive 'aliengo'"):
        load_policy(out / "last.pt", num_envs=1, robot="aliengo")
    load_policy(out / "last.pt", num_envs=1, robot="aliengo", allow_robot_mismatch=True)
    load_policy(out / "last.pt", num_envs=1, robot="go1")
    capsys.readouterr()
    assert main(["eval", "--policy", str(out / "last.pt"), "--robot", "aliengo", "--out", str(tmp_path / "e"),
                 "--num-envs", "1", "--episodes-per-cell", "1"]) == 2
    _one_line_error(capsys, "asked to drive 'aliengo'", "--allow-robot-mismatch")
    assert not (tmp_path / "e" / "eval.json").exists()


def test_mismatched_collection_is_refused_before_the_first_episode(tmp_path, capsys, monkeypatch):
    import quadforge.collection.collect as collect
    store = _store(tmp_path / "s", robot="go1")
    monkeypatch.setattr(collect, "build_env", lambda *a: pytest.fail("collected into a go1 store"))
    assert main(["collect", "--store", str(store), "--episodes", "10", "--robot", "aliengo"]) == 2
    _one_line_error(capsys, "holds 'go1' episodes", "--robot aliengo", "one robot per store")
    assert not list((store / "staging").glob("*.episode"))


def test_json_outputs_are_checked_before_the_work(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    import quadforge.tools.rollout_cmd as rollout_cmd
    monkeypatch.setattr(rollout_cmd, "run", lambda args: pytest.fail("rollout started"))
    assert main(["rollout", "--json", str(tmp_path / "file" / "r.json")]) == 2
    _one_line_error(capsys, "--json", "is a file, not a folder")


def _snapshot(root):
    """Every file under ``root`` (or the file itself) and its bytes: "nothing changed" is equality."""
    from pathlib import Path
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): p.read_bytes() for p in files}


def test_file_outputs_never_land_in_a_store_or_a_run(tmp_path, capsys, monkeypatch):
    import quadforge.tools.rollout_cmd as rollout_cmd
    monkeypatch.setattr(rollout_cmd, "run", lambda args: pytest.fail("rollout started"))
    store = _store(tmp_path / "s")
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"a checkpoint")
    before, run_before = _snapshot(store), _snapshot(run)
    manifest = store / "manifest.json"
    assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(manifest)]) == 2
    _one_line_error(capsys, f"export-hdf5 --output {manifest}", "inside the trajectory store")
    assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(store / "new" / "x.h5")]) == 2
    _one_line_error(capsys, "--output", "inside the trajectory store")   # a path's parents count too
    assert main(["rollout", "--num-envs", "2", "--seconds", "0.1", "--json", str(manifest)]) == 2
    _one_line_error(capsys, f"--json {manifest}", "inside the trajectory store")
    assert main(["rollout", "--json", str(run / "best.pt")]) == 2
    _one_line_error(capsys, f"--json {run / 'best.pt'}", "inside the training run folder")
    ppo = tmp_path / "ppo"   # a train-expert run: rsl_rl's model_<it>.pt
    ppo.mkdir()
    (ppo / "model_0.pt").write_bytes(b"a checkpoint")
    assert main(["rollout", "--json", str(ppo / "x.json")]) == 2
    _one_line_error(capsys, f"--json {ppo / 'x.json'}", "inside the training run folder")
    assert _snapshot(store) == before and _snapshot(run) == run_before
    assert main(["dataset", "info", "--store", str(store)]) == 0   # still a readable store


def test_file_outputs_replace_only_their_own_earlier_output(tmp_path, capsys, monkeypatch):
    store = _store(tmp_path / "s")
    notes, text_h5, page = tmp_path / "notes.txt", tmp_path / "old.h5", tmp_path / "README.md"
    notes.write_text("my notes\n")
    text_h5.write_text("not an export\n")
    page.write_text("# my page\n")   # text, as a .md should be, but no export: the command says what it owns
    kept = {**_snapshot(notes), **_snapshot(text_h5), **_snapshot(page)}
    for path in (notes, text_h5, page):
        assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(path)]) == 2
        _one_line_error(capsys, f"export-hdf5 --output {path}", "not an earlier output", "choose a new path")
    assert {**_snapshot(notes), **_snapshot(text_h5), **_snapshot(page)} == kept
    h5 = tmp_path / "ex.h5"
    for _ in range(2):   # a rerun replaces its own export
        assert main(["dataset", "export-hdf5", "--store", str(store), "--output", str(h5)]) == 0
    import quadforge.tools.rollout_cmd as rollout_cmd
    monkeypatch.setattr(rollout_cmd, "run", lambda args: 0)
    assert main(["rollout", "--json", str(notes)]) == 2
    _one_line_error(capsys, f"--json {notes}", "not an earlier output")
    assert main(["rollout", "--json", str(page)]) == 2
    _one_line_error(capsys, f"--json {page}", "not an earlier output")
    assert _snapshot(notes) == {str(notes): b"my notes\n"} and _snapshot(page) == {str(page): b"# my page\n"}
    (tmp_path / "r.json").write_text('{"earlier": 1}')
    (tmp_path / "empty.json").write_bytes(b"")
    assert main(["rollout", "--json", str(tmp_path / "r.json")]) == 0       # its own earlier JSON
    assert main(["rollout", "--json", str(tmp_path / "empty.json")]) == 0   # nothing to lose


def test_a_lone_compaction_lock_is_no_store(tmp_path, capsys, monkeypatch):
    import quadforge.collection.collect as collect
    monkeypatch.setattr(collect, "build_env", lambda *a: pytest.fail("collect started work"))
    other = tmp_path / "otherdir"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    (other / ".lock").write_bytes(b"")   # what `dataset compact` used to leave in any folder
    before = _snapshot(other)
    assert main(["collect", "--store", str(other), "--episodes", "2"]) == 2
    _one_line_error(capsys, f"--store {other}", "not a trajectory store", "notes.txt")
    assert _snapshot(other) == before


def test_run_folders_never_inside_a_store_and_a_run_stopped_before_its_first_checkpoint_reruns(tmp_path):
    """`train --out STORE/data/run` wrote a run among a store's arrays; a run killed before its first
    checkpoint left train_config.json, val.jsonl, tb/ and its lock, and then every rerun (plain, --resume,
    --overwrite) was refused. Such a folder is a run not begun: a plain rerun starts it afresh."""
    from quadforge.output_paths import check_run_dir
    store = tmp_path / "s"
    store.mkdir()
    (store / "manifest.json").write_text("{}")
    (store / "zarr.json").write_text("{}")
    with pytest.raises(ValueError, match=f"inside the trajectory store {store}"):
        check_run_dir(store / "data" / "run")
    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    for name in ("train_config.json", "val.jsonl", ".train.lock"):
        (run / name).write_text("")
    assert check_run_dir(run) == run
    with pytest.raises(ValueError, match="a run stopped before its first checkpoint: run it again without --resume"):
        check_run_dir(run, resume=True)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a training run"):
        check_run_dir(run)
