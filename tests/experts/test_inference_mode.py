"""Stateful policies reset by None, indices or a bool mask alike, and used in and out of
``torch.inference_mode``: rsl_rl's runner steps envs in it and a
user's evaluation loop may act in it; what runs after, in either mode, must neither fail on a state
buffer the mode made nor act otherwise than a twin that never entered it."""
from pathlib import Path

import pytest
import torch

from quadforge.envs.builder import make_env
from quadforge.experts.registry import policy_for_env

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experts" / "checkpoints"
SPECS = {"gait": ("go1", "flat", None), "quard_expert": (None, None, "quard:go_to"),
         "vla_rt1": (None, None, "quard:go_to")}


def _drive(env, policy, steps: int, inference: bool, reset_at: int) -> list[torch.Tensor]:
    out = []
    for k in range(steps):
        if k == reset_at:
            policy.reset(torch.tensor([1]))
        if inference:
            with torch.inference_mode():
                a = policy.act(env.terms)
        else:
            a = policy.act(env.terms)
        out.append(a.clone())
        env.step(a)
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_policy_acts_and_resets_in_either_mode_after_the_other(name):
    torch.set_num_threads(1)
    robot, terrain, task = SPECS[name]
    spec = str(CHECKPOINTS / "vla_rt1.pt") if name == "vla_rt1" else name
    make = (lambda: make_env(robot, terrain, num_envs=2, num_threads=1, seed=4)) if task is None else \
        (lambda: make_env(task=task, num_envs=2, seed=4, task_options={"images": name == "vla_rt1"}))
    envs = [make(), make()]
    try:
        mixed, plain = (policy_for_env(spec, e) for e in envs)
        # the mixed twin: inference-mode acts, then a reset and acts outside, then back inside
        got = _drive(envs[0], mixed, 6, True, reset_at=99) + _drive(envs[0], mixed, 6, False, reset_at=2) \
            + _drive(envs[0], mixed, 4, True, reset_at=1)
        want = _drive(envs[1], plain, 6, False, reset_at=99) + _drive(envs[1], plain, 6, False, reset_at=2) \
            + _drive(envs[1], plain, 4, False, reset_at=1)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        for e in envs:
            e.close()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_policy_reset_takes_none_indices_or_a_bool_mask_alike(name):
    """``reset(None)`` is every env, and an (N,) bool mask (an env step's ``dones``) its True rows: torch
    would read a mask as the indices 0 and 1 and reset the first two envs every step."""
    torch.set_num_threads(1)
    robot, terrain, task = SPECS[name]
    spec = str(CHECKPOINTS / "vla_rt1.pt") if name == "vla_rt1" else name
    make = (lambda: make_env(robot, terrain, num_envs=3, num_threads=1, seed=4)) if task is None else \
        (lambda: make_env(task=task, num_envs=3, seed=4, task_options={"images": name == "vla_rt1"}))
    envs = [make() for _ in range(3)]
    try:
        pols = [policy_for_env(spec, e) for e in envs]
        outs = []
        for p, e, ids in zip(pols, envs, (torch.tensor([False, True, False]), torch.tensor([1]), [1])):
            for _ in range(4):
                e.step(p.act(e.terms))
            p.reset(ids)
            outs.append(p.act(e.terms))
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
        pols[0].reset(None)
        pols[1].reset(torch.arange(3))
        assert torch.equal(pols[0].act(envs[0].terms), pols[1].act(envs[1].terms))
        for bad in ([-1], [3], torch.tensor([5])):   # -1 wrapped to the last env, silently; 3 an IndexError
            with pytest.raises(ValueError, match=r"env_ids must be in \[0, 3\)"):
                pols[0].reset(bad)
        pols[0].reset([])                            # no rows: nothing to do
    finally:
        for e in envs:
            e.close()
