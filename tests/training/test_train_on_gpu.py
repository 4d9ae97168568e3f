"""The GPU lane for the trainers (``pytest -m gpu``; skipped without CUDA): every model of the registry
trains a few steps on CUDA through its real trainer and writes a checkpoint that deploys there, and
``train-expert`` runs PPO iterations with its networks on the GPU. The CPU suite checks the placement
itself on torch's meta device (tests/training/test_device_placement.py)."""
import pytest
import torch

from quadforge.models.checkpoint import load_checkpoint
from quadforge.models.registry import model_names

from imitation_data import learnable_arrays
from test_device_placement import SMALL, VLA_TINY

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("model", model_names(trainer="imitation"))
def test_imitation_models_train_on_cuda(model, amp, tmp_path):
    from quadforge.experts.learned import load_learned
    from quadforge.training.imitation import train
    from quadforge.training.presets import preset
    cfg = preset(model, "cpu")
    cfg.batch_size, cfg.context, cfg.max_steps, cfg.val_every, cfg.log_every = 8, 8, 3, 3, 1
    cfg.model_config, cfg.amp = SMALL[model], amp
    result = train(cfg, learnable_arrays(), tmp_path, device="cuda")
    assert next(result.model.parameters()).is_cuda and load_checkpoint(tmp_path / "last.pt").step == 3
    policy = load_learned(tmp_path, num_envs=2, device="cuda")
    assert policy.act({n: torch.zeros(2, d) for n, d in policy.term_dims.items()}).is_cuda


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("model", model_names(trainer="qlearning"))
def test_germ_models_train_on_cuda(model, amp, tmp_path):
    from quadforge.training.qlearning import default_config, train
    cfg = default_config(model)
    cfg.model.num_layers, cfg.model.d_model, cfg.model.num_heads, cfg.model.ffn_hidden = 1, 16, 2, 16
    cfg.model.num_bins, cfg.model.context, cfg.batch_size, cfg.max_steps, cfg.val_every = 8, 3, 8, 3, 3
    cfg.amp = amp
    data = learnable_arrays()
    data.episode_info["terminated"] = ~data.episode_info["success"]
    summary = train(cfg, data, tmp_path, device="cuda")
    assert next(summary["model"].parameters()).is_cuda and load_checkpoint(tmp_path / "last.pt").step == 3


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("model", model_names(trainer="vla"))
def test_vla_models_train_on_cuda(model, amp, tmp_path):
    from quadforge.experts.vla import load_vla
    from quadforge.training.vla import default_config, train
    from quadforge.training.vla_data import ColourChoiceTask
    cfg = default_config(model)
    cfg.model.update(VLA_TINY, moe=model != "rt1")
    cfg.batch_size, cfg.max_steps, cfg.val_every, cfg.log_every, cfg.amp = 8, 3, 3, 1, amp
    summary = train(cfg, ColourChoiceTask(image_size=16, history=2, seed=0, success_ratio=0.75), tmp_path,
                    device="cuda", val_source=ColourChoiceTask(image_size=16, history=2, seed=1))
    assert next(summary["model"].parameters()).is_cuda and summary["val"]
    policy = load_vla(tmp_path, num_envs=2, device="cuda")
    obs = {"images/front_rgb": torch.zeros(2, 16, 16, 3, dtype=torch.uint8), "instruction": torch.zeros(2, dtype=torch.long)}
    assert policy.act(obs).is_cuda


def test_train_expert_runs_ppo_with_its_networks_on_cuda(tmp_path):
    from quadforge.training.ppo import TrainExpertConfig, train
    tiny = {"num_steps_per_env": 4, "actor_hidden_dims": [16], "critic_hidden_dims": [16], "save_interval": 1,
            "num_learning_epochs": 1, "num_mini_batches": 2, "env.episode_length_s": 0.1}
    last = train(TrainExpertConfig(out=str(tmp_path), num_envs=4, iterations=2, device="cuda", overrides=tiny))
    assert torch.load(last, weights_only=True)["iter"] == 1
