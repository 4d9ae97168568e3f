"""Every tensor a trainer makes follows its configured device (issue 23: `train --model fcnet --device
cuda` crashed on a CPU statistic meeting a CUDA batch).

Without a GPU the runs are built on torch's ``meta`` device: an op mixing a meta tensor with a CPU one
fails exactly as a CUDA/CPU mix does, so a statistic, a batch or a binner left on the CPU is caught
here. The trainer's step (batch -> loss -> backward -> optimizer step) runs on meta where the model has
no data-dependent shapes (the imitation zoo, the dense GeRM); the VLA run (whose frame encoder skips
padding frames by value) is checked through its batch preparation and every tensor it holds. The GPU
lane (``-m gpu``) trains every model a few steps on CUDA for real.
"""
import dataclasses

import pytest
import torch
from torch import nn

from quadforge.models.binning import ActionBinner
from quadforge.models.registry import model_names
from quadforge.training.distributed import DistInfo
from quadforge.training.imitation import ImitationRun
from quadforge.training.presets import preset
from quadforge.training.qlearning import GeRMRun
from quadforge.training.qlearning import default_config as germ_config
from quadforge.training.vla import VLARun
from quadforge.training.vla import default_config as vla_config
from quadforge.training.vla_data import ColourChoiceTask

from imitation_data import learnable_arrays

torch.set_num_threads(1)
META = DistInfo(device=torch.device("meta"))
SMALL = {"fcnet": dict(modes=3, hidden=16, num_layers=1, decoder_hidden=16),
         "transformer": dict(hidden=16, num_layers=1, num_heads=2, decoder_hidden=16),
         "convformer": dict(hidden=16, num_layers=1, decoder_hidden=16, use_actions=True),
         "starformer": dict(hidden=16, local_dim=4, num_layers=1, num_heads=2, local_heads=1,
                            decoder_hidden=16, use_actions=True),
         "mlp": dict(hidden=16, decoder_hidden=16)}
VLA_TINY = dict(history=2, d_model=16, tokens_per_frame=4, token_hidden=8, num_layers=1, num_heads=2,
                ffn_hidden=16, word_dim=16, num_experts=4,
                image=dict(stem_channels=8, stages=((8, 2, 1), (16, 2, 1)), expand_ratio=2))


def held_tensors(obj, seen=None):
    """Every tensor ``obj`` holds: module parameters and buffers, tensors in attributes, dicts, lists
    and dataclasses (a binner's edges), recursively."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from held_tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from held_tensors(v, seen)
    elif isinstance(obj, ActionBinner) or dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        yield from held_tensors(vars(obj), seen)


def step_on(run, device_type="meta"):
    terms = run.loss_terms(0)
    assert terms["loss"].device.type == device_type
    run.optimizer.zero_grad(set_to_none=True)
    terms["loss"].backward()
    run.optimizer.step()
    if hasattr(run, "after_step"):
        run.after_step()


@pytest.mark.parametrize("model", model_names(trainer="imitation"))
def test_imitation_step_runs_on_the_configured_device(model):
    cfg = preset(model, "cpu")
    cfg.batch_size, cfg.context, cfg.max_steps, cfg.model_config = 4, 8, 2, SMALL[model]
    run = ImitationRun(cfg, learnable_arrays(), None, META, resume=False)
    step_on(run)
    for t in held_tensors([run.model, run.objective, run.to_inputs.obs_mean, run.to_inputs.obs_std]):
        assert t.device.type == "meta"
    with torch.no_grad():   # the validation batches go through the same conversion
        assert run.objective(*run.to_inputs(run.val_batches[0])).device.type == "meta"


def test_germ_step_runs_on_the_configured_device():
    cfg = germ_config("germ-dense")
    cfg.model.num_layers, cfg.model.d_model, cfg.model.num_heads, cfg.model.ffn_hidden = 1, 16, 2, 16
    cfg.model.num_bins, cfg.model.context, cfg.batch_size, cfg.max_steps = 8, 3, 4, 2
    data = learnable_arrays()
    data.episode_info["terminated"] = ~data.episode_info["success"]
    run = GeRMRun(cfg, data, None, META, resume=False, provenance=None)
    step_on(run)
    for t in held_tensors([run.model, run.target, run.binner]):
        assert t.device.type == "meta"


@pytest.mark.parametrize("model", ["rt1", "germ"])
def test_vla_run_holds_and_prepares_everything_on_the_configured_device(model, tmp_path):
    cfg = vla_config(model)
    cfg.model.update(VLA_TINY, moe=model != "rt1")
    cfg.batch_size, cfg.max_steps, cfg.success_only, cfg.success_ratio = 4, 2, False, 0.75
    run = VLARun(cfg, ColourChoiceTask(image_size=16, history=2, seed=0, success_ratio=0.75), None, tmp_path, META,
                 resume=False, prov={})
    batch, frames, instruction = run.prepare(run.feed.next(), augment=True)
    for t in [*batch.values(), frames, instruction]:
        assert t.device.type == "meta"
    for t in held_tensors([run.model, run.target, run.binner, run.table]):
        assert t.device.type == "meta"
    run.close()


def test_deployed_policies_hold_their_state_on_the_requested_device(tmp_path):
    from quadforge.experts.learned import load_learned
    from quadforge.layout import PROPRIO, TERM_DIMS
    from quadforge.training.imitation import train
    cfg = preset("mlp", "cpu")
    cfg.batch_size, cfg.context, cfg.max_steps, cfg.model_config, cfg.tensorboard = 4, 8, 1, SMALL["mlp"], False
    train(cfg, learnable_arrays(), tmp_path)
    policy = load_learned(tmp_path, num_envs=2, device="meta")
    for t in held_tensors([policy.model, policy.obs_mean, policy.obs_std, policy.cache.state]):
        assert t.device.type == "meta"
    obs = {n: torch.zeros(2, TERM_DIMS[n]) for n in PROPRIO.term_names}   # the env's terms, on the CPU
    assert policy.act(obs).device.type == "meta"


def test_the_grad_norm_stays_on_the_device_until_logged():
    """The training loop clips every step but reads the norm only in its log rows: on a GPU a read back
    each step would stall the next batch's launch (meta raises on any read back)."""
    from quadforge.training.optim import clip_gradients
    model = nn.Linear(3, 2, device="meta")
    model(torch.zeros(4, 3, device="meta")).sum().backward()
    for max_norm in (1.0, None):
        assert clip_gradients(model, max_norm).device.type == "meta"


@pytest.mark.parametrize("model", ["transformer", "mlp"])
def test_a_deployed_model_steps_past_its_context_without_reading_the_device_back(model):
    """Once the envs' blocks fill (staggered, so every step), the block reset runs on the device: a mask
    read back (``t[mask] = 0``, ``int(pos.max())``) would sync a GPU each control step (meta raises)."""
    from quadforge.models import build_model
    net = build_model(model, obs_dim=5, action_dim=3, context=4, **SMALL[model]).to("meta").eval()
    cache = net.init_cache(2, device="meta")
    for _ in range(net.context + 3):
        assert net.step(torch.zeros(2, 5, device="meta"), cache).device.type == "meta"
