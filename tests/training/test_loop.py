"""The one step loop under both trainers (training.loop.TrainLoop): when it logs, validates and saves."""
from __future__ import annotations

from pathlib import Path

import torch

from quadforge.training.distributed import DistInfo
from quadforge.training.loop import TrainLoop


def _loop(calls: dict, max_steps: int = 7, checkpoint_every_s: float = 0.0) -> tuple[TrainLoop, torch.nn.Linear]:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    x = torch.randn(16, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])

    def loss_terms(step):
        calls["steps"].append(step)
        err = net(x) - y
        return {"loss": err.pow(2).mean(), "abs": err.abs().mean()}

    def checkpoint(step, rngs, scheduled):
        calls["saves"].append((step, scheduled, rngs is not None))
        return Path(f"last_{step}.pt")

    loop = TrainLoop(info=DistInfo(), optimizer=opt, scheduler=sched, clip_module=net, grad_clip=1.0,
                     loss_terms=loss_terms, checkpoint=checkpoint, report=calls["rows"].append,
                     max_steps=max_steps, log_every=2, val_every=3, items_per_step=16,
                     checkpoint_every_s=checkpoint_every_s,
                     validate=lambda step: calls["val"].append(step) or {"val_loss": float(step)},
                     after_step=lambda: calls.__setitem__("after", calls["after"] + 1))
    return loop, net


def test_rows_validation_and_checkpoints_fall_on_their_steps():
    calls = {"steps": [], "saves": [], "rows": [], "val": [], "after": 0}
    loop, _ = _loop(calls)
    history = loop.run(0)
    assert calls["steps"] == list(range(7)) and calls["after"] == 7
    assert [r["step"] for r in history] == [2, 3, 4, 6, 7]          # every log_every, every validation, the end
    assert calls["val"] == [3, 6, 7]
    assert [r.get("val_loss") for r in history] == [None, 3.0, None, 6.0, 7.0]
    assert calls["saves"] == [(3, True, True), (6, True, True), (7, True, True)]
    assert set(history[0]) >= {"loss", "abs", "step", "lr", "grad_norm", "samples_per_s"}
    assert history[-1]["loss"] < history[0]["loss"]   # it optimises
    assert loop.last_path == Path("last_7.pt") and calls["rows"] == history


def test_wall_time_saves_are_unscheduled_and_resume_continues_the_same_steps():
    calls = {"steps": [], "saves": [], "rows": [], "val": [], "after": 0}
    loop, _ = _loop(calls, max_steps=4, checkpoint_every_s=1e-9)
    loop.run(0)
    assert calls["saves"] == [(1, False, True), (2, False, True), (3, True, True), (4, True, True)]
    calls2 = {"steps": [], "saves": [], "rows": [], "val": [], "after": 0}
    resumed, _ = _loop(calls2, max_steps=4)
    resumed.run(2)
    assert calls2["steps"] == [2, 3] and calls2["val"] == [3, 4]
