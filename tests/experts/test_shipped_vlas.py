"""The shipped QUARD VLAs (experts/checkpoints/VLA_MODEL_CARD.md) deploy alone from the repository:
through the one policy loader, on a QUARD env's camera frames and instruction table, over the gait
controller, emitting finite 12-D commands inside the controller's ranges."""
from pathlib import Path

import pytest
import torch

from quadforge.envs.builder import make_env
from quadforge.experts.hierarchical import HL_COMMAND_DIM, controller_command_ranges
from quadforge.experts.registry import policy_for_env
from quadforge.models.checkpoint import load_checkpoint

CHECKPOINTS = Path(__file__).resolve().parents[2] / "experts" / "checkpoints"
SHIPPED = {"vla_rt1.pt": "rt1", "vla_germ_dense.pt": "germ-dense"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_vla_is_an_export_with_its_provenance(name):
    ckpt = load_checkpoint(CHECKPOINTS / name)
    assert ckpt.model_name == SHIPPED[name] and ckpt.extra["policy_kind"] == "vla"
    assert ckpt.optimizer is None and "target_state_dict" not in ckpt.extra
    assert ckpt.provenance["command"].startswith(f"quadforge train --model {SHIPPED[name]} ")
    assert ckpt.extra["settings"]["task"] == "quard:all"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_vla_drives_a_quard_env(name):
    torch.set_num_threads(1)
    env = make_env(task="quard:go_to", num_envs=2, seed=3)
    try:
        policy = policy_for_env(str(CHECKPOINTS / name), env)
        env.reset()
        policy.reset(torch.arange(env.num_envs))
        for _ in range(12):                                   # two camera frames at 5 Hz
            env.step(policy.act(env.terms))                   # the raw terms, as the rollout hands them
        hl = policy.hl_commands
        assert hl.shape == (2, HL_COMMAND_DIM) and torch.isfinite(hl).all()
        for i, (lo, hi) in enumerate(controller_command_ranges().values()):
            assert lo - 1e-6 <= float(hl[:, i].min()) and float(hl[:, i].max()) <= hi + 1e-6
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_vla_reads_a_held_out_colour_as_a_training_colour(name):
    pytest.importorskip("wordllama")
    from quadforge.envs.quard.instructions import instruction_table
    from quadforge.experts.vla import load_vla_model
    _, ckpt, model = load_vla_model(CHECKPOINTS / name)
    assert ckpt.model_config["unknown_words"] == "nearest"
    table = instruction_table()                               # the env's: training and held-out colours
    stands_for = model.frontend.instruction.backoff(table)
    assert set(stands_for) == {"gold", "orange", "pink", "purple"}
    assert set(stands_for.values()) <= {"blue", "green", "red", "yellow"}
    prepared = model.frontend.prepare_instructions(table)
    held = next(i for i, t in enumerate(table) if " gold " in f" {t} ")
    same = table.index(" ".join(stands_for.get(w, w) for w in table[held].split()))
    assert torch.equal(prepared[held], prepared[same])        # no <unk> left: the backed-off instruction
