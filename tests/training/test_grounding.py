"""The instruction-swap metric, the language-blind baseline and the auxiliary grounding target
(``training.grounding``), on toy policies and on a small paired QUARD store."""
import json
import math

import numpy as np
import pytest
import torch

from quadforge.experts.hierarchical import HL_COMMAND_NAMES
from quadforge.training.grounding import (BLIND_VOCAB, DECISION_FRAMES, TARGET_TERMS, GroundingProbe, robot_frame_polar,
                                          swap_scores, swapped_instruction, target_polar)

torch.set_num_threads(1)
WZ = HL_COMMAND_NAMES.index("ang_vel_yaw")


def _toy_command(bearing: torch.Tensor) -> torch.Tensor:
    """Walk forward and turn toward ``bearing`` (rad, + left)."""
    cmd = torch.zeros(bearing.shape[0], len(HL_COMMAND_NAMES))
    cmd[:, 0], cmd[:, WZ] = 0.5, 0.8 * bearing
    return cmd


def test_the_metric_separates_a_policy_that_reads_the_words_from_one_that_does_not():
    gen = torch.Generator().manual_seed(0)
    named = (torch.rand(200, generator=gen) - 0.5) * 1.6          # the named object's bearing
    other = -named + (torch.rand(200, generator=gen) - 0.5) * 0.2   # the other one, mostly across
    # reads the words: turns toward whichever object the instruction names
    reading = swap_scores(_toy_command(named), _toy_command(other), named, other)
    # ignores them: turns toward the object further left, whatever the instruction says
    left = torch.maximum(named, other)
    deaf = swap_scores(_toy_command(left), _toy_command(left), named, other)
    # keys on a visual cue that happens to be the named object in the original scene: the same command
    cue = swap_scores(_toy_command(named), _toy_command(named), named, other)
    assert reading["toward_named"] == 1.0 and reading["change"] > 0.3
    assert deaf["toward_named"] == 0.5 and deaf["change"] == 0.0
    assert cue["toward_named"] == 0.5 and cue["change"] == 0.0
    # contrary: turns to the other object when told the named one
    contrary = swap_scores(_toy_command(other), _toy_command(named), named, other)
    assert contrary["toward_named"] == 0.0
    # windows whose candidates are within MIN_SEPARATION of each other give no direction: not counted
    same = swap_scores(_toy_command(named), _toy_command(other), named, named + 0.01)
    assert same["windows"] == 0 and math.isnan(same["toward_named"])
    per_family = swap_scores(_toy_command(named), _toy_command(other), named, other,
                             families=["go_to"] * 100 + ["stop"] * 100)
    assert per_family["toward_named/go_to"] == 1.0 and per_family["toward_named/stop"] == 1.0


def test_robot_frame_polar_and_the_auxiliary_target_from_poses():
    base = torch.tensor([[1.0, 1.0, 0.3, math.pi / 2], [0.0, 0.0, 0.3, 0.0], [0.0, 0.0, 0.3, math.pi]])
    point = torch.tensor([[1.0, 3.0, 0.0], [3.0, 3.0, 0.0], [-1.0, 0.5, 0.0]])
    bearing, dist = robot_frame_polar(base, point)
    torch.testing.assert_close(bearing, torch.tensor([0.0, math.pi / 4, -math.atan2(0.5, 1.0)]))
    torch.testing.assert_close(dist, torch.tensor([2.0, math.hypot(3, 3), math.hypot(1, 0.5)]))
    torch.testing.assert_close(target_polar(base, point), torch.stack([bearing, dist], -1))


def test_colour_dropout_blanks_every_colour_word_and_only_those():
    from quadforge.envs.quard.words import HELD_OUT_COLOURS, TRAIN_COLOURS
    from quadforge.models.instruction import WordTokenEncoder
    from quadforge.training.grounding import UNSEEN_WORD, blank_colours
    texts = [f"go to the {c} cube, slowly with a trotting gait" for c in TRAIN_COLOURS + HELD_OUT_COLOURS]
    blanked = blank_colours(texts + ["distinguish letter d, quickly with a bounding gait", "go to the redwood"])
    assert set(blanked[:len(texts)]) == {f"go to the {UNSEEN_WORD} cube, slowly with a trotting gait"}
    assert blanked[len(texts):] == ["distinguish letter d, quickly with a bounding gait", "go to the redwood"]
    # to a words encoder a blanked training colour reads exactly as a held-out colour does
    enc = WordTokenEncoder(sorted({w for t in texts[:len(TRAIN_COLOURS)] for w in t.replace(",", "").split()}))
    assert torch.equal(enc.prepare(blanked[:1]), enc.prepare(texts[-1:]))
    from quadforge.training.vla import default_config
    cfg = default_config("rt1")
    cfg.colour_dropout = 1.5
    with pytest.raises(ValueError, match="colour_dropout=1.5"):
        cfg.validate()


def test_swapped_instruction_names_the_other_candidate():
    params = {"family": "go_to", "speed": "slowly", "gait": "trotting", "instruction": "x",
              "target": {"object": "chair", "colour": "red"}, "distractor": {"object": "cube", "colour": "blue"},
              "target_slot": [3.0, 0.7], "distractor_slot": [3.0, -0.7]}
    assert swapped_instruction(params) == "go to the blue cube, slowly with a trotting gait"
    assert swapped_instruction({**params, "instruction_swapped": True}) is None
    assert swapped_instruction({"family": "go_to"}) is None


# --- on a small paired QUARD store ---------------------------------------------------------------------

TINY = dict(history=2, d_model=16, tokens_per_frame=4, token_hidden=8, num_layers=1, num_heads=2, ffn_hidden=16,
            word_dim=16, image=dict(stem_channels=8, stages=((8, 2, 1), (16, 2, 1)), expand_ratio=2))


@pytest.fixture(scope="module")
def paired_store(tmp_path_factory):
    pytest.importorskip("quadforge.envs.quard.env")
    from quadforge.tools.cli import main
    out = tmp_path_factory.mktemp("grounding") / "paired"
    assert main(["collect", "--task", "quard:go_to", "--policy", "quard_expert", "--episodes", "12",
                 "--num-envs", "4", "--store", str(out), "--no-progress", "--seed", "2", "--counterfactual", "0.5"]) == 0
    return out


def test_the_probe_reads_held_out_windows_with_the_partner_instruction_and_scores_toy_policies(paired_store):
    from quadforge.collection.counterfactual import pairs_of
    from quadforge.data.store import TrajectoryStore
    probe = GroundingProbe.from_store(paired_store, history=2, seed=0, val_fraction=0.0, windows=64)
    assert probe is not None and len(probe) > 0
    # the decision phase: every window ends in its episode's first DECISION_FRAMES frames; 0 lifts that
    assert max(probe.frame_index) < DECISION_FRAMES
    anywhere = GroundingProbe.from_store(paired_store, history=2, seed=0, val_fraction=0.0, windows=64,
                                         decision_frames=0)
    assert max(anywhere.frame_index) >= DECISION_FRAMES
    store = TrajectoryStore.open(paired_store)
    pairs = pairs_of([store.task_params(i) for i in range(store.num_episodes)])
    assert pairs
    partner = {store.instruction_text(a): store.instruction_text(b) for a, b in pairs}
    assert set(probe.named) & set(partner)
    for named, swapped in zip(probe.named, probe.swapped):   # the metric's swap is the collected partner's
        if named in partner:
            assert swapped == partner[named]
    # held out for training: no window of a scene whose partner is in the training split
    held = GroundingProbe.from_store(paired_store, history=2, seed=0, val_fraction=0.5, windows=64)
    from quadforge.data.image_sampler import ImageWindowSampler
    val = set(ImageWindowSampler(store, history=2, split="val", val_fraction=0.5, seed=0).episodes.tolist())
    partner_of = dict(pairs)
    assert held is not None and set(held.episodes) <= val
    assert all(partner_of[e] in val for e in held.episodes if e in partner_of)
    # a policy told the truth by a lookup: turns to the bearing of the object its instruction names
    truth = {}
    for i, text in enumerate(probe.named):
        truth[(text, i)] = probe.bearing_named[i]
        truth[(probe.swapped[i], i)] = probe.bearing_other[i]
    calls = {"n": 0}

    def reading(frames, mask, texts):
        start = calls["n"] % len(probe)
        calls["n"] += len(texts)
        return _toy_command(torch.stack([truth[(t, start + k)] for k, t in enumerate(texts)]))

    def deaf(frames, mask, texts):
        return _toy_command(frames.float().mean(dim=(1, 2, 3, 4)) / 255.0)

    good, blind = probe.measure_act(reading), probe.measure_act(deaf)
    assert good["toward_named"] == 1.0 and good["change"] > 0
    assert blind["toward_named"] == 0.5 and blind["change"] == 0.0


def test_training_logs_the_swap_metric_and_a_blind_model_scores_chance(paired_store, tmp_path):
    from quadforge.training.vla import default_config, train
    cfg = default_config("rt1")
    cfg.model.update(TINY)
    cfg.max_steps, cfg.batch_size, cfg.log_every, cfg.val_every, cfg.val_batches = 2, 4, 1, 2, 1
    cfg.val_fraction, cfg.tensorboard, cfg.target_loss, cfg.families = 0.5, False, 1.0, ("go_to",)
    reading = train(cfg, str(paired_store), tmp_path / "reading")
    row = reading["val"][-1]
    assert {"swap_toward_named", "swap_change", "swap_windows"} <= set(row)
    assert {"target", "target_err_deg"} <= set(reading["history"][-1])
    assert json.loads((tmp_path / "reading" / "grounding.json").read_text())[-1]["step"] == 2
    # the loss curve a report reads: every validation row, the swap numbers with it, without TensorBoard
    from quadforge.training.curves import read_val_curve
    curve = read_val_curve(tmp_path / "reading")
    assert [r["step"] for r in curve] == [2] and curve[-1]["loss"] == pytest.approx(row["loss"])
    # the blind baseline, fine-tuned from the reading model: every word is <unk>, so the swap changes nothing
    cfg.blind_instruction, cfg.init_from, cfg.target_loss = True, str(tmp_path / "reading" / "last.pt"), 0.0
    blind = train(cfg, str(paired_store), tmp_path / "blind")
    assert blind["model"].cfg.vocab == BLIND_VOCAB
    assert blind["val"][-1]["swap_toward_named"] == 0.5 and blind["val"][-1]["swap_change"] == 0.0
    # it deploys blind: the checkpoint's vocabulary maps every word of any table to <unk>
    from quadforge.experts.vla import load_vla
    policy = load_vla(tmp_path / "blind" / "last.pt", 1, instructions=["go to the red cube, slowly with a trotting gait",
                                                                       "go to the blue ball, slowly with a trotting gait"])
    torch.testing.assert_close(policy.embeddings[0], policy.embeddings[1])


def test_a_germ_decoder_starts_on_a_grounded_front_end_and_early_windows_train(paired_store, tmp_path):
    """``frontend_from``: a GeRM w/o MoE run takes an RT-1-style run's front-end (trunk, tokens, words);
    a front-end of other shapes is a one-line error. The run also trains with ``early_share``."""
    from quadforge.models.checkpoint import load_checkpoint
    from quadforge.training.vla import default_config, train
    cfg = default_config("rt1")
    cfg.model.update(TINY)
    cfg.max_steps, cfg.batch_size, cfg.val_fraction, cfg.tensorboard = 2, 4, 0.0, False
    cfg.early_share, cfg.sampling, cfg.colour_dropout = 0.5, "uniform", 0.5
    train(cfg, str(paired_store), tmp_path / "rt1")
    rt1 = load_checkpoint(tmp_path / "rt1" / "last.pt")
    cfg = default_config("germ-dense")
    cfg.model.update(TINY)
    cfg.max_steps, cfg.batch_size, cfg.val_fraction, cfg.tensorboard = 1, 4, 0.0, False
    cfg.frontend_from, cfg.success_ratio, cfg.optim.lr = str(tmp_path / "rt1" / "last.pt"), None, 1e-12
    out = train(cfg, str(paired_store), tmp_path / "germ")
    front = {k: v for k, v in rt1.state_dict.items() if k.startswith("frontend.") and "running" not in k
             and "num_batches" not in k}
    mine = out["model"].state_dict()
    for k, v in front.items():   # lr 1e-12: the front-end is still the RT-1 run's (BatchNorm statistics aside)
        torch.testing.assert_close(mine[k], v)
    cfg.model["history"] = 3
    with pytest.raises(ValueError, match="frontend_from=.*front-end differs"):
        train(cfg, str(paired_store), tmp_path / "germ3")


def test_store_batches_carry_the_named_targets_bearing_at_the_newest_frame(paired_store):
    from quadforge.data.store import TrajectoryStore
    from quadforge.training.vla_data import open_image_source
    src = open_image_source(paired_store, 2, split="all", step_features=TARGET_TERMS)
    store = TrajectoryStore.open(paired_store)
    b = src.sampler.batch_at(np.arange(src.num_windows))
    first = (b["frame"] == 0).nonzero(as_tuple=True)[0]
    polar = src.convert(b)["target_polar"][first]
    for row, ep in zip(polar, b["episode_index"][first].tolist()):
        tx, ty = store.task_params(ep)["target_slot"]   # relative to the spawn; the robot faces +x there
        assert abs(float(row[0]) - math.atan2(ty, tx)) < 0.05 and abs(float(row[1]) - math.hypot(tx, ty)) < 0.1


def test_grounding_options_are_checked_with_one_line_errors():
    from quadforge.training.vla import default_config
    cfg = default_config("rt1")
    cfg.families = ("go_to,distinguish",)
    with pytest.raises(ValueError, match="families=.*unknown; allowed"):
        cfg.validate()
    cfg = default_config("rt1")
    cfg.blind_instruction, cfg.instruction = True, "wordllama"
    with pytest.raises(ValueError, match="blind_instruction blanks the words encoder"):
        cfg.validate()
    cfg = default_config("rt1")
    cfg.target_loss = -1.0
    with pytest.raises(ValueError, match="target_loss=-1.0; must be >= 0"):
        cfg.validate()
