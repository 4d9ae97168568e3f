import dataclasses
import shutil

import numpy as np
import pytest
import torch

from quadforge.layout import TERM_DIMS
from quadforge.models.checkpoint import load_checkpoint
from quadforge.experts.registry import load_policy
from quadforge.training.imitation import train
from quadforge.models.registry import model_names
from quadforge.training.presets import preset, presets

from imitation_data import learnable_arrays

torch.set_num_threads(1)


def _cfg(model="fcnet", steps=30, **over):
    cfg = preset(model, "cpu")
    cfg.max_steps, cfg.log_every, cfg.val_every, cfg.batch_size, cfg.context = steps, 10, 10, 32, 8
    small = {"fcnet": dict(modes=3, hidden=16, num_layers=1, decoder_hidden=16),
             "transformer": dict(hidden=16, num_layers=1, num_heads=2, decoder_hidden=16),
             "convformer": dict(hidden=16, num_layers=1, decoder_hidden=16, use_actions=True),
             "starformer": dict(hidden=16, local_dim=4, num_layers=1, num_heads=2, local_heads=1,
                                decoder_hidden=16, use_actions=True),
             "mlp": dict(hidden=16, decoder_hidden=16)}[model]
    cfg.model_config = {**small, **over.pop("model_config", {})}
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def test_presets_carry_the_papers_numbers():
    fc = preset("fcnet")
    assert (fc.context, fc.batch_size, fc.model_config["modes"], fc.model_config["hidden"],
            fc.model_config["num_layers"], fc.model_config["decoder_hidden"]) == (64, 1024, 10, 256, 4, 128)
    assert (fc.optim.name, fc.optim.lr, fc.optim.betas, fc.optim.eps, fc.optim.weight_decay, fc.optim.warmup_frac) \
        == ("adamw", 5e-3, (0.9, 0.98), 1e-9, 1e-4, 0.2)
    assert preset("transformer").optim.name == "lion" and preset("transformer").optim.lr == 5e-3
    assert preset("convformer").optim.grad_clip == 0.25 and preset("convformer").model_config["kernel"] == 6
    assert all({"cpu", "paper"} <= set(presets(m)) for m in model_names(trainer="imitation"))
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        preset("fcnet", "huge")


def test_loss_falls_and_checkpoint_deploys(tmp_path):
    data = learnable_arrays()
    cfg = _cfg(steps=60, model_config=dict(hidden=32))
    cfg.optim.lr = 1e-2
    result = train(cfg, data, tmp_path)
    first, last = result.history[0], result.history[-1]
    assert last["loss"] < 0.6 * first["loss"] and np.isfinite(last["val_loss"])
    ck = load_checkpoint(tmp_path / "last.pt")
    assert ck.model_name == "fcnet" and ck.step == 60 and ck.seed == 0
    assert ck.layout["name"] == "proprio" and ck.obs_stats["mean"].shape == (61,)
    assert ck.provenance["episodes"] == 12 and ck.provenance["train_episodes"] + ck.provenance["val_episodes"] == 12
    assert ck.optimizer is not None and ck.scheduler is not None
    assert (tmp_path / "best.pt").exists() and any((tmp_path / "tb").iterdir())

    # the checkpoint alone deploys: the policy's first actions equal the model on a one-step window
    policy = load_policy(tmp_path, num_envs=2)
    assert set(policy.obs_terms) == {t["name"] for t in ck.layout["terms"]}
    g = torch.Generator().manual_seed(0)
    terms = {n: torch.randn(2, TERM_DIMS[n], generator=g) for n in policy.obs_terms}
    a = policy.act(terms)
    x = (policy.layout.build(terms) - ck.obs_stats["mean"]) / ck.obs_stats["std"]
    with torch.no_grad():
        ref = result.model(x.unsqueeze(1))[:, 0]
    assert a.shape == (2, 12) and torch.allclose(a, ref, atol=1e-5)
    bad = dict(terms, dof_pos=torch.zeros(2, 11))
    with pytest.raises(ValueError, match="'dof_pos' has shape"):
        policy.act(bad)
    with pytest.raises(ValueError, match="needs observation term"):
        policy.act({k: v for k, v in terms.items() if k != "commands"})


def test_same_seed_same_weights_and_resume_is_exact(tmp_path):
    data = learnable_arrays()
    straight = train(_cfg(steps=20, keep_checkpoints=True), data, tmp_path / "a").model.state_dict()
    again = train(_cfg(steps=20), data, tmp_path / "b").model.state_dict()
    assert all(torch.equal(straight[k], again[k]) for k in straight)
    # interrupted at step 10 (its checkpoint), resumed to 20: the same weights as never stopping
    (tmp_path / "c").mkdir()
    shutil.copy(tmp_path / "a" / "step_10.pt", tmp_path / "c" / "last.pt")
    resumed = train(_cfg(steps=20), data, tmp_path / "c", resume=True)
    assert resumed.history[0]["step"] == 20
    assert all(torch.equal(straight[k], resumed.model.state_dict()[k]) for k in straight)
    with pytest.raises(ValueError, match="config differs"):
        train(_cfg(steps=30, model_config=dict(hidden=8)), data, tmp_path / "c", resume=True)
    with pytest.raises(ValueError, match="holds model 'fcnet', not 'mlp'"):
        train(_cfg("mlp", steps=30), data, tmp_path / "c", resume=True)
    with pytest.raises(ValueError, match="resume=True: .* holds no checkpoint"):
        train(_cfg(steps=30), data, tmp_path / "empty", resume=True)



def test_resume_refuses_a_grown_store_or_other_draws(tmp_path):
    """A store with more episodes than the run started on re-splits train and validation; another seed
    or batch size draws other batches: the resumed run would not continue the interrupted one."""
    data = learnable_arrays(num_episodes=6)
    train(_cfg(steps=4), data, tmp_path)
    with pytest.raises(ValueError, match=r"other data or draws \(episodes 6 then, 8 now\).*init_from="):
        train(_cfg(steps=8), learnable_arrays(num_episodes=8), tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"seed 0 then, 1 now"):
        train(dataclasses.replace(_cfg(steps=8), seed=1), data, tmp_path, resume=True)
    # --max-steps is the run's total: a resume asking for fewer than the checkpoint holds rewrote the run
    with pytest.raises(ValueError, match=r"--max-steps 2 is below the checkpoint's step 4"):
        train(_cfg(steps=2), data, tmp_path, resume=True)
    assert train(_cfg(steps=8), data, tmp_path, resume=True).history[-1]["step"] == 8


def test_a_fresh_run_clears_the_tensorboard_logs_of_the_one_it_replaces(tmp_path):
    """A rerun of a run stopped before its first checkpoint (or an --overwrite) logged its curves beside the
    stopped run's: TensorBoard showed both as one."""
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.old").write_bytes(b"stale")
    (tmp_path / "train_config.json").write_text("{}")
    train(_cfg(steps=2), learnable_arrays(num_episodes=6), tmp_path)
    assert not (tmp_path / "tb" / "events.out.tfevents.old").exists() and (tmp_path / "last.pt").is_file()


@pytest.mark.parametrize("model", ["transformer", "convformer", "starformer", "mlp"])
def test_every_model_trains_and_deploys(model, tmp_path):
    data = learnable_arrays(num_episodes=6)
    result = train(_cfg(model, steps=10), data, tmp_path)
    assert np.isfinite(result.history[-1]["loss"])
    policy = load_policy(tmp_path / "last.pt", num_envs=3)
    terms = {n: torch.zeros(3, TERM_DIMS[n]) for n in policy.obs_terms}
    for _ in range(10):   # past the block length: the caches restart
        assert policy.act(terms).shape == (3, 12)
    policy.reset(torch.tensor([0, 2]))


def test_success_only_and_nll(tmp_path):
    data = learnable_arrays()
    result = train(_cfg(steps=10, success_only=True, loss="nll"), data, tmp_path)
    ck = load_checkpoint(tmp_path / "last.pt")
    assert ck.provenance["success_only"] and ck.provenance["train_episodes"] + ck.provenance["val_episodes"] == 9
    assert ck.extra["log_std"].shape == (12,) and np.isfinite(result.history[-1]["loss"])


def test_rtg_model_trains_and_deploys_with_target_return(tmp_path):
    data = learnable_arrays(num_episodes=6)
    train(_cfg("transformer", steps=5, model_config=dict(use_rtg=True, use_actions=True)), data, tmp_path)
    ck = load_checkpoint(tmp_path / "last.pt")
    assert ck.extra["target_return"] > 0
    policy = load_policy(tmp_path, num_envs=2)
    assert policy.act({n: torch.zeros(2, TERM_DIMS[n]) for n in policy.obs_terms}).shape == (2, 12)


def test_last_checkpoint_by_wall_time_too(tmp_path, monkeypatch):
    """Issue 13: a slow run writes last.pt every checkpoint_every_s, not only at validations."""
    import quadforge.training.imitation as imitation
    saved = []
    real = imitation.save_run_checkpoint
    monkeypatch.setattr(imitation, "save_run_checkpoint",
                        lambda out, ck, step, keep: saved.append(("last.pt", ck.step)) or real(out, ck, step, keep))
    train(_cfg("mlp", steps=4, val_every=100, checkpoint_every_s=1e-9), learnable_arrays(num_episodes=4), tmp_path)
    assert [s for name, s in saved if name == "last.pt"] == [1, 2, 3, 4]   # 1-3 by wall time, 4 the final validation
    saved.clear()
    train(_cfg("mlp", steps=4, val_every=100, checkpoint_every_s=0), learnable_arrays(num_episodes=4), tmp_path / "b")
    assert [s for name, s in saved if name == "last.pt"] == [4]


def test_default_preset_fits_the_device():
    from quadforge.training.cli import add_arguments, default_preset
    assert default_preset("cpu") == "cpu" and default_preset("cuda:1") == "paper"
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert "Default: 'cpu' on a CPU device" in " ".join(p.format_help().split())   # --help says which and why


def test_train_takes_an_open_store_and_a_torch_device(tmp_path):
    from quadforge.data.store import TrajectoryStore
    from quadforge.data.synthetic_store import write_synthetic_store
    write_synthetic_store(tmp_path / "s", num_steps=400, episode_length=50)
    result = train(_cfg("mlp", steps=2), TrajectoryStore.open(tmp_path / "s"), tmp_path / "run",
                   device=torch.device("cpu"))
    assert result.history[-1]["step"] == 2
    assert load_checkpoint(tmp_path / "run").provenance["store"] == str((tmp_path / "s").resolve())


def test_a_second_training_into_a_folder_in_use_is_refused_naming_the_first(tmp_path):
    """Two trainings writing one --out at once would interleave their files, each reporting its run as
    written: while one holds the folder, another is refused (and a folder left holding only the lock
    file of a finished or killed run counts as empty)."""
    from quadforge.data.locks import acquire
    from quadforge.output_paths import RUN_LOCK, check_run_dir
    out = tmp_path / "run"
    with acquire(out / RUN_LOCK, "training imitation"):
        with pytest.raises(ValueError, match=r"held by training imitation pid \d+.*one training per --out"):
            train(_cfg(steps=2), learnable_arrays(num_episodes=4), out)
    check_run_dir(out)                                     # only the released lock file: an empty folder
    assert train(_cfg(steps=2), learnable_arrays(num_episodes=4), out).history[-1]["step"] == 2


@pytest.mark.parametrize("model", ["starformer", "convformer"])
def test_a_model_reading_its_previous_actions_is_refused_on_relabelled_data(model, tmp_path):
    """A relabelled store's ``actions`` are the expert's labels, ``applied_actions`` what drove the env:
    an action-input model would learn from the labels as its previous actions, which the deployed model
    never sees. Refused, naming the source; without action inputs, or on expert data, it trains."""
    from quadforge.data.episodes import EpisodeArrays
    data = learnable_arrays()
    relabelled = EpisodeArrays({**data.features, "applied_actions": data.features["actions"] * 0.5},
                               data.episode_ends, data.episode_info)
    with pytest.raises(ValueError, match="reads its previous actions.*in-memory EpisodeArrays"):
        train(_cfg(model, steps=2), relabelled, None)
    train(_cfg(model, steps=2, model_config={"use_actions": False}), relabelled, None)
    train(_cfg(model, steps=2), data, None)
