"""Vision-language-action models: FiLM identity at init, TokenLearner, a causal front-end, command bins,
instruction encoders, training on synthetic image windows, deployment (batch-N, image rate, settings)."""
import dataclasses
import socket

import pytest
import torch

from quadforge.experts.hierarchical import HL_COMMAND_NAMES, command_binner, controller_command_ranges
from quadforge.models.germ_vla import GeRMVLA
from quadforge.models.instruction import (WordLlamaEncoder, WordTokenEncoder, build_vocabulary, load_wordllama,
                                          slot_fillers)
from quadforge.models.rt1 import RT1
from quadforge.models.tokenlearner import TokenLearner
from quadforge.models.vision import FiLM, FiLMImageEncoder, ImageEncoderConfig, random_shift
from quadforge.models.vla import VLAConfig, images_to_float, rank_mask
from quadforge.training.vla_data import ColourChoiceTask, check_batch

torch.set_num_threads(1)

INSTRUCTIONS = ["go to the red cube", "go to the blue cube", "go to the red ball", "stop the green ball"]


def _cfg(**kw) -> VLAConfig:
    base = dict(image_size=(16, 16), history=3, vocab=tuple(build_vocabulary(INSTRUCTIONS)), d_model=16,
                tokens_per_frame=4, token_hidden=8, num_layers=2, num_heads=2, ffn_hidden=16, word_dim=16,
                num_experts=4, top_k=2, num_bins=9, image=dict(stem_channels=8, stages=((8, 2, 1), (16, 1, 1)),
                                                                expand_ratio=2))
    base.update(kw)
    return VLAConfig.make(**base)


# --- FiLM / trunk / TokenLearner -----------------------------------------------------------------
def test_film_is_identity_at_init_and_conditions_after_training_step():
    torch.manual_seed(0)
    film = FiLM(cond_dim=5, channels=3)
    x, e = torch.randn(4, 3, 6, 6), torch.randn(4, 5)
    assert torch.equal(film(x, e), x)
    with torch.no_grad():
        film.gamma.weight.normal_()
    y = film(x, e)
    assert not torch.allclose(y[0], x[0])
    # one scale per channel: the ratio y/x is constant over space
    ratio = (y / x)[0, 0]
    assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), atol=1e-5)


def test_trunk_ignores_the_instruction_at_init():
    torch.manual_seed(0)
    enc = FiLMImageEncoder(ImageEncoderConfig(image_size=(16, 16), stem_channels=8, stages=((8, 2, 1),),
                                              out_channels=12, cond_dim=5)).eval()
    img = torch.rand(2, 3, 16, 16)
    a, b = enc(img, torch.randn(2, 5)), enc(img, torch.randn(2, 5))
    assert torch.equal(a, b)
    assert a.shape == (2, 12) + enc.cfg.feature_size()


def test_tokenlearner_shapes_and_attention_sums_to_one_over_space():
    torch.manual_seed(0)
    tl = TokenLearner(dim=12, num_tokens=5, hidden=7)
    x = torch.randn(3, 12, 4, 6)
    a = tl.attention_maps(x)
    assert a.shape == (3, 5, 24)
    assert torch.allclose(a.sum(-1), torch.ones(3, 5), atol=1e-6)
    assert (a >= 0).all()
    z = tl(x)
    assert z.shape == (3, 5, 12)
    # each token is the attention-weighted mean of the map's feature vectors
    assert torch.allclose(z[1, 2], (a[1, 2][None] * x[1].flatten(1)).sum(-1), atol=1e-5)


def test_random_shift_moves_whole_windows_and_keeps_pixels():
    torch.manual_seed(0)
    img = torch.rand(4, 3, 3, 10, 10)
    out = random_shift(img, pad=2)
    assert out.shape == img.shape
    assert torch.equal(random_shift(img, pad=0), img)
    # the same shift for every frame of a sample: frame differences are shifted, not scrambled
    same = torch.zeros(2, 1, 1, 10, 10)
    same[:, :, :, 4:6, 4:6] = 1.0
    shifted = random_shift(same.expand(2, 3, 1, 10, 10).contiguous(), pad=2)
    assert torch.equal(shifted[:, 0], shifted[:, 1]) and torch.equal(shifted[:, 1], shifted[:, 2])
    assert float(shifted.sum()) == pytest.approx(24.0)   # a 2x2 patch x 3 frames x 2 samples, never cut


def test_colour_jitter_turns_hues_keeps_grey_and_treats_a_window_as_one():
    import colorsys
    from quadforge.models.vision import hue_rotation, random_colour_jitter
    red, yellow, grey = torch.tensor([0.9, 0.1, 0.1]), torch.tensor([0.95, 0.85, 0.1]), torch.full((3,), 0.5)
    third = hue_rotation(torch.tensor([2 * torch.pi / 3]))[0]
    assert torch.allclose(third @ red, torch.tensor([0.1, 0.9, 0.1]), atol=1e-5)     # 120°: red -> green
    assert torch.allclose(third @ grey, grey, atol=1e-6)
    turned = hue_rotation(torch.tensor([-torch.pi / 6]))[0] @ yellow                  # -30°: yellow -> orange
    assert colorsys.rgb_to_hsv(*turned.clamp(0, 1).tolist())[0] * 360 == pytest.approx(28, abs=3)
    # one draw per window: every frame of a sample gets the same transform (a constant window stays constant)
    torch.manual_seed(0)
    window = torch.rand(5, 1, 3, 8, 8).expand(5, 4, 3, 8, 8).contiguous()
    out = random_colour_jitter(window, hue_deg=40, saturation=0.5, brightness=0.3)
    assert out.shape == window.shape and out.min() >= 0 and out.max() <= 1
    assert all(torch.equal(out[:, 0], out[:, t]) for t in range(1, 4))
    assert not torch.allclose(out, window)
    assert torch.equal(random_colour_jitter(window, 0, 0, 0), window)
    # grey pixels only change brightness, never hue or saturation
    flat = torch.full((3, 2, 3, 4, 4), 0.4)
    g = random_colour_jitter(flat, hue_deg=90, saturation=0.5, brightness=0.0)
    assert torch.allclose(g, flat, atol=1e-6)
    # a tint mixes in white: black turns a uniform grey no lighter than the largest share
    black = random_colour_jitter(torch.zeros(6, 2, 3, 4, 4), 0, 0, 0, tint=0.5)
    assert float(black.max()) <= 0.5 and float(black.max()) > 0
    assert all(torch.equal(black[i], torch.full_like(black[i], float(black[i, 0, 0, 0, 0]))) for i in range(6))
    from quadforge.training.vla import default_config
    for name, bad in (("hue_jitter", 200.0), ("saturation_jitter", 1.0), ("brightness_jitter", -0.1),
                      ("tint_jitter", 1.5)):
        cfg = default_config("rt1")
        setattr(cfg, name, bad)
        with pytest.raises(ValueError, match=f"{name}={bad}"):
            cfg.validate()


# --- front-end and models ------------------------------------------------------------------------
@pytest.mark.parametrize("cls,moe", [(RT1, False), (GeRMVLA, True), (GeRMVLA, False)])
def test_front_end_and_model_are_causal_over_frame_history(cls, moe):
    torch.manual_seed(0)
    model = cls(_cfg(moe=moe)).eval()
    fe = model.frontend
    frames = torch.rand(2, 3, 3, 16, 16)
    mask = torch.ones(2, 3, dtype=torch.bool)
    ins = fe.prepare_instructions(INSTRUCTIONS[:2])
    e = fe.embed_instruction(ins)
    toks = fe.encode_frames(frames, mask, e)
    later = frames.clone()
    later[:, 2] = torch.rand(2, 3, 16, 16)
    toks2 = fe.encode_frames(later, mask, e)
    assert torch.allclose(toks[:, :2], toks2[:, :2]) and not torch.allclose(toks[:, 2], toks2[:, 2])
    # the decoder's frame-t tokens never attend to later frames
    rank = torch.arange(3).repeat_interleave(4)
    allowed = rank_mask(rank, torch.ones(2, 12, dtype=torch.bool), 12)[0, 0]
    assert not allowed[:4, 4:].any() and allowed[8:, :].all()
    # padding frames are never encoded and do not change the action
    pad_mask = torch.tensor([[False, True, True]] * 2)
    a = model.act_from_tokens(*fe(frames, pad_mask, ins))
    junk = frames.clone()
    junk[:, 0] = torch.rand(2, 3, 16, 16)
    assert torch.equal(a, model.act_from_tokens(*fe(junk, pad_mask, ins)))


def test_rt1_and_germ_shapes_and_germ_greedy_matches_teacher_forcing():
    torch.manual_seed(0)
    frames, mask = torch.rand(3, 3, 3, 16, 16), torch.ones(3, 3, dtype=torch.bool)
    rt1 = RT1(_cfg())
    ins = rt1.frontend.prepare_instructions(INSTRUCTIONS[:3])
    assert rt1(frames, mask, ins).logits.shape == (3, 12, 9)
    g = GeRMVLA(_cfg(moe=True)).eval()
    with torch.no_grad():
        g.heads.weight.normal_(0, 1.0)
    bins, q = g.greedy_from_tokens(*g.frontend(frames, mask, ins))
    assert bins.shape == (3, 12) and ((q >= 0) & (q <= 1)).all()
    forced = g(frames, mask, ins, bins[:, :-1]).logits.argmax(-1)
    assert torch.equal(forced, bins)
    counts, dense = g.parameter_counts(), GeRMVLA(_cfg(moe=True).dense_matched()).parameter_counts()
    assert counts["active"] < counts["total"] and dense["active"] == dense["total"]
    with pytest.raises(ValueError, match="dense decoder"):
        RT1(_cfg(moe=True))


# --- bins and instructions -----------------------------------------------------------------------
def test_command_bins_round_trip_and_cover_the_controller_ranges():
    binner = command_binner(256)
    ranges = controller_command_ranges()
    lo = torch.tensor([ranges[n][0] for n in HL_COMMAND_NAMES])
    hi = torch.tensor([ranges[n][1] for n in HL_COMMAND_NAMES])
    x = lo + (hi - lo) * torch.rand(500, 12, generator=torch.Generator().manual_seed(0))
    err = (binner.decode(binner.encode(x)) - x).abs()
    assert (err <= binner.widths[:, :1].T / 2 + 1e-6).all()
    assert torch.equal(binner.encode(hi[None] + 1.0), torch.full((1, 12), 255))   # out of range clamps
    t = HL_COMMAND_NAMES.index("terminate")
    assert binner.decode(binner.encode(torch.ones(1, 12)))[0, t] > 0.5


def test_word_encoder_separates_targets_and_maps_unknown_words():
    torch.manual_seed(0)
    enc = WordTokenEncoder(build_vocabulary(INSTRUCTIONS), dim=16).eval()
    ids = enc.prepare(INSTRUCTIONS + ["go to the gold cube"])
    assert ids[-1].tolist()[3] == 1                                  # "gold" is unknown
    e = enc(ids)
    assert e.shape == (5, 16)
    assert not torch.allclose(e[0], e[1], atol=1e-4)                 # red vs blue cube
    assert not torch.allclose(e[0], e[2], atol=1e-4)                 # cube vs ball
    with pytest.raises(ValueError, match="at most"):
        enc.prepare(["go " * 30])


def test_slot_fillers_are_the_words_that_stand_in_the_same_place():
    table = ["go to the red cube", "go to the gold cube", "go to the blue ball", "stop the pacing ball"]
    assert slot_fillers(table, "gold") == {"red"}                   # "blue" stands beside "ball", not "cube"
    assert slot_fillers(table + ["go to the blue cube"], "gold") == {"red", "blue"}
    assert slot_fillers(table, "stop") == set()


def test_unknown_word_backoff_reads_a_new_colour_as_a_known_colour(monkeypatch):
    pytest.importorskip("wordllama")
    vocab = build_vocabulary(["go to the red cube", "go to the blue cube", "go to the yellow cube", "pacing"])
    table = [f"go to the {c} cube" for c in ("red", "blue", "yellow", "gold", "purple")] + ["go pink"]
    plain = WordTokenEncoder(vocab, dim=16)
    assert plain.backoff(table) == {}                               # default: unknown words stay <unk>
    enc = WordTokenEncoder(vocab, dim=16, unknown_words="nearest")
    # the frozen embedding's nearest colour among the words standing in the slot; "pink", alone in its
    # slot, has no stand-in (wordllama's nearest vocabulary word to it is "pacing", not a colour)
    assert enc.backoff(table) == {"gold": "yellow", "purple": "blue"}
    ids = enc.prepare(table)
    assert torch.equal(ids[3], ids[2]) and torch.equal(ids[4], ids[1])
    assert enc.prepare(["go pink"])[0, 1] == 1                       # <unk>
    with pytest.raises(ValueError, match="unknown_words"):
        WordTokenEncoder(vocab, dim=16, unknown_words="closest")
    with pytest.raises(ValueError, match="unknown_words"):
        _cfg(instruction="wordllama", unknown_words="nearest")
    cfg = _cfg(unknown_words="nearest")
    assert VLAConfig.from_dict(cfg.to_dict()).unknown_words == "nearest"


def test_blend_backoff_mixes_near_ties_from_the_learned_word_vectors():
    pytest.importorskip("wordllama")
    vocab = build_vocabulary([f"go to the {c} cube" for c in ("red", "blue", "yellow", "green")])
    table = [f"go to the {c} cube" for c in ("red", "blue", "yellow", "green", "gold", "orange")]
    enc = WordTokenEncoder(vocab, dim=16, unknown_words="blend")
    mix = enc.backoff_weights(table)
    assert set(mix) == {"gold", "orange"} and set(mix["orange"]) == {"red", "blue", "yellow", "green"}
    assert sum(mix["orange"].values()) == pytest.approx(1.0)
    # wordllama puts orange as near red as yellow: the mix keeps both; gold is clearly yellow
    assert 0.3 < mix["orange"]["red"] < 0.7 and 0.3 < mix["orange"]["yellow"] < 0.7
    assert mix["gold"]["yellow"] > 0.95
    assert enc.backoff(table) == {"gold": "yellow", "orange": max(mix["orange"], key=mix["orange"].get)}
    ids = enc.prepare(table)
    assert ids[4, 3] >= len(vocab) + 2 and ids[5, 3] >= len(vocab) + 2 and ids[4, 3] != ids[5, 3]
    assert torch.equal(enc.prepare(table), ids)                       # the same mixes keep their ids
    vectors = enc.word_vectors(ids)
    expected = sum(w * enc.embed.weight[enc.index[c]] for c, w in mix["orange"].items())
    assert torch.allclose(vectors[5, 3], expected, atol=1e-6)         # the weighted sum of learned vectors
    assert torch.equal(vectors[:4], enc.embed(ids[:4]))               # known words read as before
    (enc(ids[5:6]) * torch.arange(16.0)).sum().backward()             # the mix follows the learned vectors
    assert float(enc.embed.weight.grad[enc.index["red"]].abs().sum()) > 0
    nearest = WordTokenEncoder(vocab, dim=16, unknown_words="nearest")
    assert nearest.backoff_weights(table)["gold"] == {"yellow": 1.0}
    assert int(nearest.prepare(table).max()) < len(vocab) + 2         # nearest stays inside the vocabulary


def test_wordllama_loads_offline_and_separates_targets(monkeypatch):
    pytest.importorskip("wordllama")

    def no_network(*a, **k):
        raise OSError("network disabled in this test")
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    load_wordllama.cache_clear()                                    # load it here, with the network off
    enc = WordLlamaEncoder()
    v = enc(enc.prepare(INSTRUCTIONS))
    assert v.shape == (4, 256)
    assert torch.allclose(v.norm(dim=-1), torch.ones(4), atol=1e-4)
    assert float((v[0] - v[1]).norm()) > 1e-3 and float((v[0] - v[2]).norm()) > 1e-3


# --- data interface ------------------------------------------------------------------------------
def test_colour_task_meets_the_batch_interface():
    task = ColourChoiceTask(image_size=16, history=3, seed=0, success_ratio=0.75)
    batch = task.sample(32)
    check_batch(batch, 3, (16, 16))
    f, m = batch["frames"], batch["frame_mask"]
    assert (f[~m] == 0).all() and m[:, 2].all()                      # newest frame always real
    assert torch.equal(~m[:, 3], batch["last"])
    with pytest.raises(ValueError, match="history"):
        check_batch(batch, 4, (16, 16))


def test_images_to_float():
    u8 = torch.full((2, 4, 5, 3), 255, dtype=torch.uint8)
    x = images_to_float(u8)
    assert x.shape == (2, 3, 4, 5) and float(x.max()) == 1.0
    with pytest.raises(ValueError, match="RGB"):
        images_to_float(torch.zeros(2, 4, 5))


def test_vla_config_round_trips():
    cfg = _cfg(moe=True)
    assert VLAConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown fields"):
        VLAConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="vocab"):
        VLAConfig.make(vocab=())
    assert dataclasses.replace(cfg).dense_matched().moe is False


def test_store_source_adapts_the_image_window_sampler_batch():
    """The image store's sampler batch (issue 14's format) becomes this trainer's batch."""
    from types import SimpleNamespace

    import numpy as np

    from quadforge.training.vla_data import StoreImageSource
    b, h = 3, 2
    batch = {"images/front_rgb": torch.full((b, h, 8, 8, 3), 7, dtype=torch.uint8),
             "next_images/front_rgb": torch.full((b, 8, 8, 3), 9, dtype=torch.uint8),
             "mask": torch.tensor([[False, True], [True, True], [True, True]]),
             "actions": torch.arange(b * h * 12, dtype=torch.float32).reshape(b, h, 12),
             "sparse_reward": torch.tensor([0.0, 0.0, 1.0]), "next_valid": torch.tensor([True, True, False]),
             "last": torch.tensor([False, False, True]), "done": torch.tensor([0.0, 0.0, 0.0]),
             "success": torch.tensor([1.0, 0.0, 1.0]), "instruction": torch.tensor([0, 1, 1]),
             "episode_index": torch.tensor([0, 1, 0]), "frame": torch.tensor([0, 3, 4])}
    sampler = SimpleNamespace(history=h, instructions=["go to the red cube", "stop the blue ball"],
                              caches={"images/front_rgb": None}, sample=lambda n: batch)
    store = SimpleNamespace(array=lambda name: np.zeros((10, 8, 8, 3), np.uint8), tasks={"quard:go_to": [], "quard:stop": []},
                            frame_stride=lambda name: 10, frame_counts=lambda name: np.array([5, 6]))
    src = StoreImageSource(sampler, store, gamma=0.5)
    assert src.settings == {"task": "quard:all", "camera": {"name": "front", "height": 8, "width": 8},
                            "image_every": 10, "control_hz": 50}
    out = src.sample(b)
    check_batch(out, h, (8, 8))
    assert out["frames"][:, -1].eq(9).all() and out["frames"][:, 0].eq(7).all()
    assert out["frame_mask"].tolist() == [[False, True, True], [True, True, True], [True, True, False]]
    assert torch.equal(out["action"], batch["actions"][:, -1])
    # MC return: success * gamma^(frames to the end): episode 0 has 5 frames (4 after frame 0), 0 after 4
    assert out["mc_return"].tolist() == pytest.approx([0.5 ** 4, 0.0, 1.0])
    batch["instruction"] = torch.tensor([0, -1, 1])
    with pytest.raises(ValueError, match="without an instruction"):
        src.sample(b)


def test_germ_image_targets_match_separate_forward_passes_of_the_two_windows():
    """The image-rate Eq. 2 targets, rebuilt by hand: dims < d-1 from the CURRENT window (frames 0..T-1)
    teacher-forced on the dataset bins, the last dim r + γ·max Q(next window = frames 1..T, dim 0), and no
    bootstrap where the episode ended; computed without gradients."""
    from quadforge.training.vla import VLATrainConfig, q_targets
    torch.manual_seed(0)
    t, k = 3, 9
    net = GeRMVLA(_cfg(moe=True)).eval()
    with torch.no_grad():
        net.heads.weight.normal_(0, 1.0)
    ins = net.frontend.prepare_instructions(INSTRUCTIONS[:3])
    frames, mask = torch.rand(3, t + 1, 3, 16, 16), torch.ones(3, t + 1, dtype=torch.bool)
    mask[0, :2] = False                                                   # an episode start: padded frames
    bins = torch.randint(0, k, (3, 12))
    batch = {"reward": torch.tensor([0.0, 1.0, 0.0]), "discount": torch.full((3,), 0.9),
             "done": torch.tensor([False, False, True]), "last": torch.tensor([False, True, True]),
             "mc_return": torch.zeros(3)}
    cfg = VLATrainConfig(model_name="germ", objective="q", mc_lower_bound=False)
    y = q_targets(net, frames, mask, ins, bins, batch, cfg)
    assert not y.requires_grad
    q_now = torch.sigmoid(net(frames[:, :t], mask[:, :t], ins, bins[:, :-1]).logits)
    q_next = torch.sigmoid(net(frames[:, 1:], mask[:, 1:], ins).logits[:, 0])
    assert torch.allclose(y[:, :-1], q_now[:, 1:].max(-1).values, atol=1e-5)
    assert torch.allclose(y[:, -1], torch.stack([0.9 * q_next[0].max(), torch.tensor(1.0), torch.tensor(0.0)]),
                          atol=1e-5)
