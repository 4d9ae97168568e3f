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
    assert ckpt.model_config["unknown_words"] == "blend"
    table = instruction_table()                               # the env's: training and held-out colours
    enc = model.frontend.instruction
    mixes = enc.backoff_weights(table)
    assert set(mixes) == {"gold", "orange", "pink", "purple"}
    assert all(set(m) <= {"blue", "green", "red", "yellow"} and abs(sum(m.values()) - 1) < 1e-5 for m in mixes.values())
    # the clear winners keep nearly all the weight; orange, as near red as yellow, stays a mix of both
    assert enc.backoff(table) == {"gold": "yellow", "pink": "red", "purple": "blue", "orange": "yellow"}
    assert mixes["gold"]["yellow"] > 0.95 and mixes["purple"]["blue"] > 0.95
    assert min(mixes["orange"]["red"], mixes["orange"]["yellow"]) > 0.3
    prepared = model.frontend.prepare_instructions(table)
    assert int((prepared == 1).sum()) == 0                    # no <unk> left
    held = next(i for i, t in enumerate(table) if " orange " in f" {t} ")
    with torch.no_grad():
        e = model.frontend.embed_instruction(prepared)
    as_red, as_yellow = (table.index(table[held].replace("orange", c)) for c in ("red", "yellow"))
    # the mixed instruction is neither colour's instruction and lies between them
    d_red, d_yellow = float((e[held] - e[as_red]).norm()), float((e[held] - e[as_yellow]).norm())
    assert d_red > 1e-3 and d_yellow > 1e-3 and d_red + d_yellow < 1.5 * float((e[as_red] - e[as_yellow]).norm())
