"""A broken baseline fails here: on one fixed synthetic sequence task every model of the zoo, trained
under its own ``cpu`` preset (architecture, optimizer, lr, schedule), reaches a validation loss within
BASELINE_FACTOR of the best model's.

The task needs history: the action at step t mixes the joint positions at t with the joint velocities
three steps earlier (zero before the episode starts), so a model that cannot use its window, or whose
optimizer setting cannot train it in the budget, lands far behind. Signals are smooth 0.5-3 Hz
sinusoids like 50 Hz sensor data (``data.synthetic``). Issue 17's failure mode - the Transformer's old
preset (Lion 3e-4, positional embedding N(0, 1)) at 2-5x the others' loss - is checked to fail
(``test_the_old_transformer_preset_would_fail``).

Slow-marked: the five trainings take ~20 s of CPU (StARformer half of it), the old preset ~3 s more.
"""
import numpy as np
import pytest
import torch

from quadforge.data.episodes import EpisodeArrays
from quadforge.data.synthetic import synthetic_episode
from quadforge.layout import get_layout
from quadforge.training.imitation import train
from quadforge.models.registry import model_names
from quadforge.training.presets import preset

# every model within this factor of the best model's validation loss. Measured (150 steps, batch 32):
# DC 0.070 (best), FCNet 1.4x, StARformer 1.6x (N(0, 0.02) positions), MLP 1.8x, Transformer 2.1x under
# the swept presets;
# the Transformer's old preset 5.2x. 3x sits between with margin on both sides.
BASELINE_FACTOR = 3.0
STEPS, BATCH, LAG = 150, 32, 3

torch.set_num_threads(1)
pytestmark = pytest.mark.slow


def sequence_task(num_episodes: int = 96, length: int = 40, seed: int = 0) -> EpisodeArrays:
    rng = np.random.default_rng(seed)
    terms = get_layout("proprio").term_names
    episodes = [synthetic_episode(rng, length, True, features=terms) for _ in range(num_episodes)]
    feats = {n: np.concatenate([e[n] for e in episodes]).astype(np.float32) for n in terms}
    w_pos = rng.normal(size=(12, 12)) / np.sqrt(12 * 1.0)
    w_vel = rng.normal(size=(12, 12)) / np.sqrt(12 * 1.0)
    actions = []
    for e in episodes:
        lagged = np.zeros_like(e["dof_vel"])
        lagged[LAG:] = e["dof_vel"][:-LAG]
        actions.append(np.tanh(e["dof_pos"] @ w_pos + lagged @ w_vel))
    feats["actions"] = np.concatenate(actions).astype(np.float32)
    ends = np.arange(1, num_episodes + 1) * length
    return EpisodeArrays(feats, ends, {"success": np.ones(num_episodes, dtype=bool)})


def _val_loss(cfg, data) -> float:
    cfg.max_steps, cfg.batch_size, cfg.val_fraction = STEPS, BATCH, 0.25
    cfg.val_every = cfg.log_every = STEPS
    cfg.tensorboard = False
    history = train(cfg, data, None).history
    return [h["val_loss"] for h in history if "val_loss" in h][-1]


@pytest.fixture(scope="module")
def task():
    return sequence_task()


@pytest.fixture(scope="module")
def zoo_losses(task):
    return {model: _val_loss(preset(model, "cpu"), task) for model in model_names(trainer="imitation")}


def test_every_model_within_factor_of_the_best(task, zoo_losses):
    targets = task.features["actions"]
    best_model = min(zoo_losses, key=zoo_losses.get)
    best = zoo_losses[best_model]
    # the task is learnable and was learnt: the best model is far below predicting the mean
    assert best < 0.5 * float(targets.var(axis=0).mean()), zoo_losses
    behind = {m: round(v / best, 2) for m, v in zoo_losses.items() if v > BASELINE_FACTOR * best}
    assert not behind, f"models more than {BASELINE_FACTOR}x the best ({best_model} {best:.4f}): {behind}; {zoo_losses}"


def test_the_old_transformer_preset_would_fail(task, zoo_losses):
    old = preset("transformer", "cpu")
    old.optim.name, old.optim.lr, old.optim.betas = "lion", 3e-4, (0.9, 0.99)
    old.model_config["pos_init_std"] = 1.0          # torch's nn.Embedding default, the old model's init
    loss = _val_loss(old, task)
    assert loss > BASELINE_FACTOR * min(zoo_losses.values()), (loss, zoo_losses)
