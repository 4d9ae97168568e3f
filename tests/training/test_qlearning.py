"""GeRM's conservative discretized Q-learning: Eq. 2 targets on a hand-built 2-dimension 2-step example
(next dimension at the same step; r + γ·max over the NEXT step's first dimension; no bootstrap after a
terminal), the conservative term, the MC lower bound, EMA, and end-to-end training on a tiny offline
bandit-chain where GeRM recovers the optimal action and imitation of all data does not."""
import shutil
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from quadforge.data.episodes import EpisodeArrays
from quadforge.layout import PROPRIO, TERM_DIMS
from quadforge.experts.policy import check_policy
from quadforge.experts.registry import load_policy
from quadforge.models.checkpoint import load_checkpoint
from quadforge.models.germ import GeRMConfig, GeRMOutput
from quadforge.models.losses import bellman_targets, conservative_loss, ema_update, td_loss, with_mc_lower_bound
from quadforge.training.qlearning import default_config, q_targets, train

torch.set_num_threads(1)
GAMMA = 0.9


# --- a hand-built Q table standing in for the target network --------------------------------------
class TableQ(nn.Module):
    """2 action dimensions, 3 bins; the step index is obs[..., -1, 0] of the window.

    Q(step s, dim 0, b) = DIM0[s][b];  Q(step s, dim 1 | a0, b) = DIM1[s][a0][b].
    """
    DIM0 = torch.tensor([[0.10, 0.20, 0.30],     # step 0
                         [0.70, 0.40, 0.50]])    # step 1
    DIM1 = torch.tensor([[[0.11, 0.61, 0.21], [0.12, 0.32, 0.92], [0.13, 0.23, 0.33]],
                         [[0.41, 0.42, 0.43], [0.44, 0.45, 0.46], [0.47, 0.48, 0.49]]])

    def forward(self, obs, mask, prefix_bins=None):
        s = obs[:, -1, 0].long()                                            # (B,)
        q = [self.DIM0[s]]
        if prefix_bins is not None and prefix_bins.shape[1] > 0:
            q.append(self.DIM1[s, prefix_bins[:, 0]])
        q = torch.stack(q, 1)
        return GeRMOutput(torch.logit(q), torch.zeros(()))


def _two_step_batch(done_last: bool):
    """Transitions of one 2-step episode: t=0 -> t=1, and t=1 -> (end)."""
    obs = torch.tensor([[[0.0]], [[1.0]]])                                 # (B=2, n=1, 1) step index
    next_obs = torch.tensor([[[1.0]], [[0.0]]])                            # zeros where no next step
    return {"obs": obs, "mask": torch.ones(2, 1, dtype=torch.bool), "next_obs": next_obs,
            "next_mask": torch.tensor([[True], [False]]), "reward": torch.tensor([0.0, 1.0]),
            "discount": torch.tensor([GAMMA, GAMMA]), "done": torch.tensor([0.0, float(done_last)]),
            "last": torch.tensor([False, True]), "mc_return": torch.tensor([0.0, 0.0])}


def test_hand_built_targets_two_dims_two_steps():
    batch = _two_step_batch(done_last=True)
    bins = torch.tensor([[1, 2], [0, 1]])                                  # dataset bins per step
    y = q_targets(TableQ(), batch, bins, mc_lower_bound=False)
    # step 0, dim 0: max over dim 1's bins at the SAME step given a0 = 1 -> max(0.12, 0.32, 0.92)
    assert y[0, 0] == pytest.approx(0.92)
    # step 0, dim 1 (last): r + γ · max over the NEXT step's dim 0 -> 0 + 0.9 · 0.70
    assert y[0, 1] == pytest.approx(GAMMA * 0.70)
    # GeRM's published bug would use the same step's dim 0 (max 0.30): not what we compute
    assert y[0, 1] != pytest.approx(GAMMA * 0.30)
    # step 1, dim 0: next dimension at the same step given a0 = 0 -> max(0.41, 0.42, 0.43)
    assert y[1, 0] == pytest.approx(0.43)
    # step 1 is terminal: no bootstrap, only r
    assert y[1, 1] == pytest.approx(1.0)


def test_no_bootstrap_after_terminal_or_unstored_next_step_but_bootstrap_otherwise():
    q_same = torch.full((3, 2, 4), 0.5)
    q_next = torch.tensor([[0.2, 0.8, 0.1, 0.0]]).expand(3, 4)
    y = bellman_targets(q_same, q_next, reward=torch.tensor([0.0, 0.0, 1.0]),
                        discount=torch.tensor([GAMMA, GAMMA ** 3, GAMMA]),
                        bootstrap=torch.tensor([True, True, False]))
    assert y[:, 1].tolist() == pytest.approx([GAMMA * 0.8, GAMMA ** 3 * 0.8, 1.0])
    batch = _two_step_batch(done_last=False)   # time-out at the episode end: next step not stored
    y = q_targets(TableQ(), batch, torch.tensor([[1, 2], [0, 1]]), mc_lower_bound=False)
    assert y[1, 1] == pytest.approx(1.0)


def test_target_is_max_of_bellman_and_mc_per_sample():
    bellman = torch.tensor([[0.2, 0.5], [0.9, 0.1], [0.0, 0.0]])
    mc = torch.tensor([0.4, 0.3, 0.0])
    torch.testing.assert_close(with_mc_lower_bound(bellman, mc, "all"),
                               torch.tensor([[0.4, 0.5], [0.9, 0.3], [0.0, 0.0]]))
    # default: the bound applies where the Bellman backup meets the reward (the last dimension)
    torch.testing.assert_close(with_mc_lower_bound(bellman, mc), torch.tensor([[0.2, 0.5], [0.9, 0.3], [0.0, 0.0]]))
    batch = _two_step_batch(done_last=True)
    batch["mc_return"] = torch.tensor([0.95, 0.0])
    bins = torch.tensor([[1, 2], [0, 1]])
    plain = q_targets(TableQ(), batch, bins, mc_lower_bound=False)
    for dims in ("last", "all"):
        y = q_targets(TableQ(), batch, bins, mc_lower_bound=True, mc_bound_dims=dims)
        torch.testing.assert_close(y[:, -1], torch.maximum(plain[:, -1], batch["mc_return"]))
    torch.testing.assert_close(q_targets(TableQ(), batch, bins, True, "all"),
                               torch.maximum(plain, batch["mc_return"][:, None]))
    with pytest.raises(ValueError, match="mc_bound_dims"):
        with_mc_lower_bound(bellman, mc, "first")


def test_conservative_term_pushes_non_dataset_bins_to_zero_only():
    logits = torch.randn(4, 3, 6, requires_grad=True)
    q = torch.sigmoid(logits)
    assert bool(((q >= 0) & (q <= 1)).all())
    bins = torch.randint(0, 6, (4, 3))
    loss = conservative_loss(q, bins)
    expected = 0.5 * torch.stack([
        (q[b, i].pow(2).sum() - q[b, i, bins[b, i]].pow(2)) / 5 for b in range(4) for i in range(3)]).mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    data = torch.nn.functional.one_hot(bins, 6).bool()
    assert bool((logits.grad[data] == 0).all())            # the dataset bin gets no gradient from it
    assert bool((logits.grad[~data] > 0).all())            # descent lowers every other bin's Q
    zero = conservative_loss(torch.nn.functional.one_hot(bins, 6).float(), bins)
    assert float(zero) == 0.0                              # minimal when non-dataset Q are 0


def test_td_loss_only_touches_dataset_bins():
    logits = torch.zeros(2, 2, 4, requires_grad=True)
    bins = torch.tensor([[0, 3], [1, 1]])
    td_loss(torch.sigmoid(logits), bins, torch.ones(2, 2)).backward()
    data = torch.nn.functional.one_hot(bins, 4).bool()
    assert bool((logits.grad[~data] == 0).all()) and bool((logits.grad[data] < 0).all())


def test_ema_update():
    online, target = nn.Linear(2, 2), nn.Linear(2, 2)
    before = target.weight.detach().clone()
    ema_update(target, online, tau=0.75)
    torch.testing.assert_close(target.weight, 0.75 * before + 0.25 * online.weight.detach())


# --- end to end on a tiny offline bandit-chain ----------------------------------------------------
A, B = -1.0, 1.0        # behaviour's common action (succeeds 20 %) and the optimal one (succeeds 90 %)


def bandit_chain(num_episodes: int = 400, seed: int = 0, action_dim: int = 12) -> EpisodeArrays:
    """2-step episodes: the step-0 action's dimension 0 decides success; step 1 sees it as last_action.

    Behaviour picks A 80 % of the time, so most failures follow A, most data is A, and imitation of
    all data picks A; the optimal action is B. Dimension 1 is uniform noise, the rest constant.
    """
    rng = np.random.default_rng(seed)
    steps = 2 * num_episodes
    feats = {name: np.zeros((steps, TERM_DIMS[name]), np.float32) for name in PROPRIO.term_names}
    acts = np.zeros((steps, action_dim), np.float32)
    first = rng.random(num_episodes) < 0.8
    success = rng.random(num_episodes) < np.where(first, 0.2, 0.9)
    acts[0::2, 0] = np.where(first, A, B)
    acts[1::2, 0] = np.where(rng.random(num_episodes) < 0.8, A, B)
    acts[:, 1] = rng.uniform(-1, 1, steps)
    acts[:, 2:] = 0.3
    feats["dof_pos"][1::2, 0] = 1.0                                   # the step index
    feats["last_action"][1::2, :action_dim] = acts[0::2]              # step 1 remembers the choice
    terminated = np.zeros(steps, np.float32)
    terminated[1::2] = ~success                                       # failures fall at the last step
    feats.update(actions=acts, terminated=terminated)
    return EpisodeArrays(feats, np.arange(2, steps + 1, 2), {"success": success})


def _tiny(model_name: str, **kw):
    cfg = default_config(model_name)
    cfg.model = GeRMConfig(obs_dim=0, num_bins=8, context=2, d_model=32, num_layers=1, num_heads=2,
                           ffn_hidden=32, num_experts=4, top_k=2)
    cfg.optim.lr, cfg.optim.warmup_frac = 3e-3, 0.05
    cfg.batch_size, cfg.max_steps, cfg.tau, cfg.gamma = 64, 300, 0.9, GAMMA
    cfg.log_every, cfg.val_every, cfg.val_batches, cfg.tensorboard = 100, 1000, 1, False
    cfg.success_ratio = None
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def _first_action(checkpoint: str) -> float:
    policy = check_policy(load_policy(checkpoint, num_envs=1))
    policy.reset(torch.tensor([0]))
    terms = {name: torch.zeros(1, TERM_DIMS[name]) for name in policy.obs_terms}   # step 0
    return float(policy.act(terms)[0, 0])


@pytest.mark.parametrize("model_name,expected", [
    ("germ", B), ("germ-il", A), pytest.param("germ-dense", B, marks=pytest.mark.slow)])
def test_germ_recovers_optimal_action_imitation_of_all_data_does_not(tmp_path, model_name, expected):
    # 2 action dimensions keep it fast; the 12-D version is the slow test below
    data = bandit_chain(action_dim=2)
    cfg = _tiny(model_name, success_only=False, max_steps=300 if model_name != "germ-il" else 150)
    summary = train(cfg, data, tmp_path)
    assert _first_action(summary["checkpoint"]) == pytest.approx(expected, abs=0.2)


@pytest.mark.slow
def test_germ_recovers_optimal_action_with_12_dimensions(tmp_path):
    data = bandit_chain(action_dim=12)
    summary = train(_tiny("germ", success_only=False, max_steps=1000), data, tmp_path)
    assert _first_action(summary["checkpoint"]) == pytest.approx(B, abs=0.2)


def test_checkpoint_deploys_alone_and_same_seed_same_weights(tmp_path):
    data = bandit_chain(60)
    runs = [train(_tiny("germ", max_steps=5), data, tmp_path / name) for name in ("a", "b")]
    a, b = (load_checkpoint(r["checkpoint"]) for r in runs)
    for k in a.state_dict:
        assert torch.equal(a.state_dict[k], b.state_dict[k]), k
    assert a.layout["name"] == "proprio" and a.extra["action_space"] == "joint"
    assert a.extra["binner"]["edges"].shape == (12, 9)
    assert a.obs_stats["mean"].shape == (PROPRIO.dim,)
    policy = load_policy(tmp_path / "a", num_envs=3)
    out = policy.act({n: torch.randn(3, TERM_DIMS[n]) for n in policy.obs_terms})
    assert out.shape == (3, 12) and policy.action_space == "joint"
    edges = a.extra["binner"]["edges"]
    assert bool((out >= edges[:, 0]).all()) and bool((out <= edges[:, -1]).all())


def test_resume_continues_exactly(tmp_path):
    data = bandit_chain(60)
    full = train(_tiny("germ", max_steps=6, val_every=3, keep_every=3), data, tmp_path / "full")
    (tmp_path / "split").mkdir()   # as if the run had died after step 3
    shutil.copy(tmp_path / "full" / "step_3.pt", tmp_path / "split" / "last.pt")
    resumed = train(_tiny("germ", max_steps=6), data, tmp_path / "split", resume=True)
    a, b = load_checkpoint(full["checkpoint"]), load_checkpoint(resumed["checkpoint"])
    assert b.step == 6
    for k in a.state_dict:
        torch.testing.assert_close(a.state_dict[k], b.state_dict[k], msg=k)
    for k in a.extra["target_state_dict"]:
        torch.testing.assert_close(a.extra["target_state_dict"][k], b.extra["target_state_dict"][k], msg=k)
    # on data that has grown since, a resume would re-split: refused
    with pytest.raises(ValueError, match=r"other data or draws \(episodes 60 then, 70 now"):
        train(_tiny("germ", max_steps=9), bandit_chain(70), tmp_path / "split", resume=True)
    with pytest.raises(ValueError, match=r"batch_size \d+ then, 7 now"):
        train(_tiny("germ", max_steps=9, batch_size=7), data, tmp_path / "split", resume=True)


def test_dense_baseline_is_matched_and_hl_commands_are_a_command_policy(tmp_path):
    data = bandit_chain(40)
    data.features["hl_commands"] = data.features["actions"].copy()
    s = train(_tiny("germ-dense", max_steps=2, action_feature="hl_commands"), data, tmp_path)
    m = train(_tiny("germ", max_steps=2), data, tmp_path / "moe")
    assert s["active_parameters"] == s["total_parameters"]
    assert abs(s["total_parameters"] - m["active_parameters"]) / m["active_parameters"] < 0.02
    assert load_policy(s["checkpoint"], 1).action_space == "command"


def test_n_step_transitions_train(tmp_path):
    s = train(_tiny("germ", max_steps=2, n_step=3, mc_bound_dims="all"), bandit_chain(20), tmp_path)
    assert load_checkpoint(s["checkpoint"]).train_config["n_step"] == 3
    assert np.isfinite(s["history"][-1]["loss"])


def test_a_single_episode_trains_without_validation(tmp_path, capsys):
    s = train(_tiny("germ", max_steps=2), bandit_chain(1), tmp_path)
    assert s["val"] == [] and "validation disabled" in capsys.readouterr().out


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="GeRM model"):
        default_config("germ-xl")
    with pytest.raises(ValueError, match="preset"):
        default_config("germ", "huge")
    cfg = _tiny("germ", action_feature="torques")
    with pytest.raises(ValueError, match="action feature"):
        cfg.validate()
    with pytest.raises(ValueError, match="gamma"):
        _tiny("germ", gamma=1.5).validate()


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    summary = train(_tiny("germ", max_steps=4, val_every=4, log_every=2), bandit_chain(60), out_dir)
    torch.save({"model": summary["model"].state_dict(), "target": summary["target"].state_dict()},
               f"{out_dir}/rank{rank}.pt")


@pytest.mark.slow   # spawning two torch processes takes ~40 s on the loaded 2-core machine
def test_two_cpu_ranks_train_and_checkpoint(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for part in ("model", "target"):   # DDP kept the weights, and so the EMA targets, identical
        assert all(torch.equal(r0[part][k], r1[part][k]) for k in r0[part]), part
    ckpt = load_checkpoint(tmp_path / "last.pt")
    assert ckpt.step == 4 and set(ckpt.extra["rng"]) == {"rank0", "rank1"}
    assert load_policy(tmp_path, 1).act({n: torch.zeros(1, TERM_DIMS[n]) for n in PROPRIO.term_names}).shape == (1, 12)


# --- the command line, on a real zarr store ------------------------------------------------------
def _store(path, n=8):
    from quadforge.data.compaction import compact
    from quadforge.data.writer import StagingWriter
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    rng = np.random.default_rng(0)
    w = StagingWriter(path, "c0")
    for i in range(n):
        success = i % 4 != 3
        w.write_episode(synthetic_episode(rng, int(rng.integers(5, 15)), success), synthetic_info(i, success))
    compact(path)
    return path


TINY_OVERRIDES = ["model.num_layers=1", "model.d_model=16", "model.num_heads=2", "model.ffn_hidden=16",
                  "model.num_bins=16", "model.context=3", "val_every=2"]


def test_cli_trains_on_a_store_resumes_and_deploys(tmp_path, capsys):
    from quadforge.tools.cli import main
    from quadforge.experts.registry import load_policy as deploy_load_policy
    store, out = _store(tmp_path / "store"), tmp_path / "run"
    args = ["train", "--model", "germ", "--store", str(store), "--out", str(out), "--max-steps", "2",
            "--batch-size", "8", *TINY_OVERRIDES]
    assert main(args) == 0
    assert list((out / "tb").glob("events.*")), "TensorBoard events"
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt.step == 2 and ckpt.model_name == "germ" and ckpt.provenance["episodes"] == 8
    assert ckpt.provenance["data"].endswith("store")
    assert main([*args[:7], "--max-steps", "4", "--resume", *args[9:]]) == 0
    assert load_checkpoint(out / "last.pt").step == 4
    policy = check_policy(deploy_load_policy(out, num_envs=2))   # the project-wide loader routes here
    assert policy.policy_id.startswith("germ:")
    assert policy.act({n: torch.zeros(2, TERM_DIMS[n]) for n in policy.obs_terms}).shape == (2, 12)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from quadforge.tools.cli import main
    assert main(["train", "--model", "germ", "--store", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "no trajectory store" in capsys.readouterr().err
    store = _store(tmp_path / "store", n=4)
    assert main(["train", "--model", "germ", "--store", str(store), "--out", str(tmp_path / "o"), "alpah=1"]) == 2
    assert "no field 'alpah'" in capsys.readouterr().err
    assert main(["train", "--model", "germ-huge", "--store", str(store), "--out", str(tmp_path / "o")]) == 2
    assert "allowed" in capsys.readouterr().err
