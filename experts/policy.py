"""The one policy protocol: experts, learned models and (later) VLAs all meet it.

A policy is reset for a set of env ids and acts on a batch of *named* observation terms (see
``quadforge.layout``), keeping whatever recurrent state it needs (gait phase, FCNet's frequency cache, a KV
cache). Collection and evaluation use only this protocol.

Action spaces:
- ``"joint"``: 12-D normalised joint actions, the rsl_rl / legged_gym convention
  ``q_target = q_default + action_scale * action`` (the env applies it).
- ``"command"``: a high-level command (GeRM's 12-D command of seed 003 Eq. 9) that a low-level policy
  turns into joint actions; ``HierarchicalPolicy`` composes the two.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

import torch

ACTION_SPACES = ("joint", "command")


@runtime_checkable
class Policy(Protocol):
    #: a stable identifier recorded with every episode it produces (e.g. "gait:trot", "fcnet:<hash>")
    policy_id: str
    #: the raw observation terms it reads (names from quadforge.layout.TERM_DIMS)
    obs_terms: tuple[str, ...]
    #: "joint" or "command"
    action_space: str
    action_dim: int

    def reset(self, env_ids: torch.Tensor) -> None:
        """Forget the recurrent state of these envs (called at episode start)."""

    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(num_envs, action_dim) actions for the batch of named terms, each (num_envs, term_dim)."""


def given_terms(obs: Mapping[str, torch.Tensor]) -> str:
    """What a policy was given, for its missing-term error: the keys, and the fix when they are the env's
    rsl_rl observation (a TensorDict of ``policy``/``critic`` vectors, whose truth value and iteration
    torch refuses) instead of its named terms."""
    keys = sorted(str(k) for k in obs.keys())
    if {"policy", "critic"} <= set(keys):
        return f"got {keys}: the env's flat rsl_rl observation; policies act on its named terms (`env.terms`)"
    return f"got {keys}"


def nothing_to_compile(names: str) -> str:
    """The refusal of ``--compile-expert`` for policies (``names``) that run no gait controller."""
    return (f"--compile-expert: {names} has nothing to compile; it applies to the gait expert (gait:<gait>) "
            "and the policies built over it (quard_expert, command-space checkpoints, DAgger's --relabel gait)")


def compile_experts(*policies: object) -> None:
    """Run the model-based experts among ``policies`` through ``torch.compile`` (``--compile-expert``):
    each that has ``compile_expert`` compiles, wrappers (a hierarchical policy, DAgger's relabelling) pass
    it on to their parts. A ValueError when none of them has anything to compile."""
    able = [p for p in policies if callable(getattr(p, "compile_expert", None))]
    if not able:
        raise ValueError(nothing_to_compile(", ".join(str(getattr(p, "policy_id", type(p).__name__)) for p in policies)))
    for p in able:
        p.compile_expert()


def check_policy(policy: object) -> Policy:
    """Raise a clear error when an object does not meet the protocol."""
    missing = [a for a in ("policy_id", "obs_terms", "action_space", "action_dim", "reset", "act")
               if not hasattr(policy, a)]
    if missing:
        raise TypeError(f"{type(policy).__name__} is not a quadforge Policy: missing {missing}")
    if policy.action_space not in ACTION_SPACES:
        raise ValueError(f"{type(policy).__name__}.action_space={policy.action_space!r}; allowed: {ACTION_SPACES}")
    return policy  # type: ignore[return-value]


def checkpoint_policy_id(kind: str, path: str | Path, weights: Mapping[str, Any] | None = None,
                         config: Any = None) -> str:
    """The one policy-id scheme for policies loaded from files: ``<kind>:<file name>:<digest>``.

    ``kind`` names what the file holds (``rsl_rl_v5``, ``wtw``, a model name such as ``fcnet`` or
    ``germ``). The digest is of what acts: for a checkpoint written here, its ``weights`` (tensors by
    name) and model ``config``; for another format, the file's bytes. So a retrained file in the same place
    gets a new id while a copy, a fresh clone's shipped checkpoint or a same-seed rerun keeps it (a digest
    of path and modification time did not; nor did the file's bytes of a rerun into another folder, whose
    provenance records other paths). Built-in policies use ``<kind>:<variant>`` (``gait:trot``, ``zero``)."""
    path = Path(path)
    digest = hashlib.sha1()
    if weights is not None:
        digest.update(json.dumps(config, sort_keys=True, default=str).encode())
        for name in sorted(weights):
            t = weights[name]
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return f"{kind}:{path.name}:{digest.hexdigest()[:10]}"
