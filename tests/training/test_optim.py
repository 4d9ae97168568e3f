import math

import pytest
import torch
from torch import nn

from quadforge.training.optim import Lion, OptimConfig, build_optimizer, build_scheduler, clip_gradients, warmup_cosine

torch.set_num_threads(1)


def test_warmup_cosine_shape():
    total, warm = 100, 20
    lrs = [warmup_cosine(s, total, warm, 0.1) for s in range(total + 1)]
    assert lrs[0] == pytest.approx(1 / 20) and lrs[19] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:19], lrs[1:20]))           # linear warmup rises
    assert all(a >= b for a, b in zip(lrs[20:], lrs[21:]))           # cosine decays monotonically
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[-1] == pytest.approx(0.1)


def test_scheduler_follows_lambda_and_resumes():
    model = nn.Linear(3, 2)
    cfg = OptimConfig(lr=1e-2, warmup_frac=0.2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, total_steps=10)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step(); sched.step()
    assert seen[0] == pytest.approx(1e-2 * 0.5) and seen[1] == pytest.approx(1e-2)
    opt2 = build_optimizer(model, cfg)
    sched2 = build_scheduler(opt2, cfg, total_steps=10)
    opt2.load_state_dict(opt.state_dict()); sched2.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])


def test_no_weight_decay_on_vectors():
    opt = build_optimizer(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), OptimConfig(weight_decay=0.1))
    decays = {p.ndim: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decays == {2: 0.1, 1: 0.0}


def test_lion_update_is_signed_step_with_decoupled_decay():
    p = nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    p.grad = torch.tensor([0.3, -0.0001, 0.0])
    opt.step()
    # first step: m=0, update = sign(0.1*g); decay multiplies by (1 - lr*wd) first
    expected = torch.tensor([1.0, -2.0, 3.0]) * (1 - 0.05) - 0.1 * torch.tensor([1.0, -1.0, 0.0])
    assert torch.allclose(p.detach(), expected)
    assert torch.allclose(opt.state[p]["exp_avg"], 0.01 * torch.tensor([0.3, -0.0001, 0.0]))


def test_lion_handles_complex_params_and_minimises():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, dtype=torch.cfloat))
    opt = Lion([w], lr=0.02)
    for _ in range(500):
        opt.zero_grad()
        loss = (w - (1 + 2j)).abs().pow(2).sum()
        loss.backward(); opt.step()
    assert torch.allclose(w.detach(), torch.full((4,), 1 + 2j), atol=0.05)


def test_clip_gradients_reports_norm_and_clips():
    model = nn.Linear(2, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    assert float(clip_gradients(model, 1.0)) == pytest.approx(5.0)
    assert torch.linalg.vector_norm(model.weight.grad) == pytest.approx(1.0, rel=1e-5)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    assert float(clip_gradients(model, None)) == pytest.approx(5.0)


@pytest.mark.parametrize("field,value", [("name", "sgd"), ("lr", 0.0), ("warmup_frac", 1.0), ("betas", (0.9, 1.5))])
def test_bad_config_names_the_field(field, value):
    cfg = OptimConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        build_optimizer(nn.Linear(1, 1), cfg)
