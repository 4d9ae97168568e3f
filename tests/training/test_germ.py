"""GeRM Q-network and action binning: shapes, causality, the autoregressive heads, greedy decoding
(cache == full recompute), parameter matching of the dense baseline, binning round trip and clamp."""
import numpy as np
import pytest
import torch

from quadforge.models.binning import ActionBinner, fit_binner
from quadforge.models.germ import ContextWindow, GeRM, GeRMConfig

torch.set_num_threads(1)


def _cfg(**kw) -> GeRMConfig:
    base = dict(obs_dim=5, action_dim=3, num_bins=7, context=4, d_model=16, num_layers=2, num_heads=2,
                ffn_hidden=16, num_experts=4, top_k=2)
    base.update(kw)
    return GeRMConfig(**base)


def _model(**kw) -> GeRM:
    torch.manual_seed(0)
    m = GeRM(_cfg(**kw)).eval()
    with torch.no_grad():  # larger heads so argmaxes are well separated
        m.heads.weight.normal_(0, 1.0)
    return m


# --- binning ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["uniform", "quantile"])
def test_binning_round_trip_within_half_a_bin(method):
    rng = np.random.default_rng(0)
    data = np.stack([rng.normal(0, 1, 5000), rng.uniform(-3, 2, 5000), rng.exponential(1, 5000)], 1)
    b = fit_binner(data, num_bins=256, method=method)
    x = torch.as_tensor(data, dtype=torch.float32)
    idx = b.encode(x)
    assert idx.dtype == torch.long and int(idx.min()) >= 0 and int(idx.max()) < 256
    err = (b.decode(idx) - x).abs()
    half = 0.5 * b.widths.gather(1, idx.T).T
    assert bool((err <= half + 1e-5).all())


def test_binning_uniform_min_max_edges_and_clamp():
    b = fit_binner(np.array([[-1.0, 0.0], [1.0, 10.0]]), num_bins=4)
    torch.testing.assert_close(b.edges[0], torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0]))
    idx = b.encode(torch.tensor([[-5.0, 100.0], [0.1, 2.6], [1.0, -0.1]]))
    assert idx.tolist() == [[0, 3], [2, 1], [3, 0]]
    torch.testing.assert_close(b.decode(idx)[0], torch.tensor([-0.75, 8.75]))


def test_binning_percentile_margin_and_degenerate_dims():
    data = np.concatenate([np.linspace(0, 1, 1001), [50.0]])[:, None].repeat(2, 1)
    data[:, 1] = 3.0                      # a constant dimension still gets valid, tiny bins
    b = fit_binner(data, num_bins=8, percentile=1.0)
    assert float(b.edges[0, -1]) < 2.0    # the outlier did not stretch the bins
    assert bool((b.widths > 0).all())
    idx = b.encode(torch.tensor([[0.5, 3.0]]))
    assert float((b.decode(idx)[0, 1] - 3.0).abs()) <= 0.5 * float(b.widths[1, idx[0, 1]]) + 1e-6


def test_binning_quantile_with_repeated_values_stays_strictly_increasing():
    data = np.array([0.0] * 900 + [1.0] * 100)[:, None]
    b = fit_binner(data, num_bins=16, method="quantile")
    assert bool((b.widths > 0).all())
    assert b.decode(b.encode(torch.tensor([[1.0]]))).item() == pytest.approx(1.0, abs=0.1)


def test_binning_serialises_and_rejects_bad_input():
    b = fit_binner(np.random.default_rng(1).normal(size=(100, 2)), num_bins=8)
    assert torch.equal(ActionBinner.from_dict(b.to_dict()).edges, b.edges)
    with pytest.raises(ValueError, match="method"):
        fit_binner(np.zeros((3, 2)), method="log")
    with pytest.raises(ValueError, match="NaN"):
        fit_binner(np.array([[np.nan]]))
    with pytest.raises(ValueError, match="dimensions"):
        b.encode(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="bin indices"):
        b.decode(torch.tensor([[8, 0]]))


# --- the Q-network ------------------------------------------------------------------------------
def test_forward_shapes_and_q_in_unit_interval():
    m = _model()
    obs, mask = torch.randn(6, 4, 5), torch.ones(6, 4, dtype=torch.bool)
    bins = torch.randint(0, 7, (6, 3))
    out = m(obs, mask, bins[:, :2])
    assert out.logits.shape == (6, 3, 7)
    q = torch.sigmoid(out.logits)
    assert bool(((q > 0) & (q < 1)).all())
    assert m(obs, mask).logits.shape == (6, 1, 7)


def test_dimension_i_sees_only_bins_of_earlier_dimensions():
    m = _model()
    obs, mask = torch.randn(2, 4, 5), torch.ones(2, 4, dtype=torch.bool)
    a = torch.tensor([[1, 2], [3, 4]])
    b = a.clone(); b[:, 1] = torch.tensor([6, 0])   # change dimension 1's bin only
    la, lb = m(obs, mask, a).logits, m(obs, mask, b).logits
    torch.testing.assert_close(la[:, :2], lb[:, :2])   # dims 0, 1 do not see dim 1's bin
    assert not torch.allclose(la[:, 2], lb[:, 2])       # dim 2 does


def test_left_padding_is_ignored_and_history_matters():
    m = _model()
    obs = torch.randn(1, 4, 5)
    mask = torch.tensor([[False, False, True, True]])
    other = obs.clone(); other[:, :2] = 123.0            # garbage in the padded steps
    torch.testing.assert_close(m(obs, mask).logits, m(other, mask).logits)
    full = torch.ones(1, 4, dtype=torch.bool)
    assert not torch.allclose(m(obs, full).logits, m(other, full).logits)


def test_greedy_decoding_matches_teacher_forced_argmax():
    m = _model()
    obs, mask = torch.randn(5, 4, 5), torch.ones(5, 4, dtype=torch.bool)
    mask[0, :3] = False
    bins, q = m.greedy(obs, mask)
    assert bins.shape == (5, 3) and q.shape == (5, 3)
    logits = m(obs, mask, bins[:, :2]).logits          # same heads, full recompute (no cache)
    assert torch.equal(logits.argmax(-1), bins)
    torch.testing.assert_close(q, torch.sigmoid(logits.max(-1).values))


@pytest.mark.parametrize("moe", [True, False])
def test_backward_reaches_all_trained_parts(moe):
    m = _model(moe=moe).train()
    out = m(torch.randn(4, 4, 5), torch.ones(4, 4, dtype=torch.bool), torch.randint(0, 7, (4, 2)))
    (out.logits.pow(2).mean() + out.aux_loss).backward()
    for name in ("time_pos", "dim_pos", "heads.weight", "action_embed.weight"):
        assert m.get_parameter(name).grad.abs().sum() > 0, name


def test_dense_baseline_matches_active_parameters():
    cfg = GeRMConfig(obs_dim=48, d_model=64, num_layers=2, num_heads=4, ffn_hidden=128)
    moe, dense = GeRM(cfg), GeRM(cfg.dense_matched())
    assert moe.active_parameters() < moe.total_parameters()
    assert dense.active_parameters() == dense.total_parameters()
    assert abs(dense.total_parameters() - moe.active_parameters()) / moe.active_parameters() < 0.01


def test_context_window_rolls_and_resets_per_env():
    w = ContextWindow(num_envs=2, context=3, obs_dim=1)
    for v in (1.0, 2.0):
        seq, mask = w.push(torch.full((2, 1), v))
    assert seq[0, :, 0].tolist() == [0.0, 1.0, 2.0] and mask[0].tolist() == [False, True, True]
    w.reset(torch.tensor([1]))
    seq, mask = w.push(torch.full((2, 1), 3.0))
    assert seq[0, :, 0].tolist() == [1.0, 2.0, 3.0] and mask[0].tolist() == [True, True, True]
    assert mask[1].tolist() == [False, False, True]


def test_step_equals_greedy_on_the_window():
    m = _model()
    w = ContextWindow(3, 4, 5)
    frames = torch.randn(6, 3, 5)
    for t in range(6):
        bins = m.step(frames[t], w)
    lo = 2
    expected, _ = m.greedy(frames[lo:6].transpose(0, 1), torch.ones(3, 4, dtype=torch.bool))
    assert torch.equal(bins, expected)


def test_unimplemented_encoders_and_bad_config():
    with pytest.raises(NotImplementedError, match="image"):
        GeRM(_cfg(encoder="image"))
    with pytest.raises(ValueError, match="encoder"):
        GeRM(_cfg(encoder="lidar"))
    with pytest.raises(ValueError, match="divisible"):
        GeRM(_cfg(d_model=15))
    with pytest.raises(ValueError, match="context"):
        _model()(torch.randn(1, 3, 5), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="unknown fields"):
        GeRMConfig.from_dict({"obs_dim": 3, "width": 2})


def test_bench_tables_run_on_a_tiny_config():
    from quadforge.tools.bench.germ import latency_table, throughput_table
    cfg = GeRMConfig(obs_dim=61, action_dim=12, num_bins=16, context=2, d_model=16, num_layers=1,
                     num_heads=2, ffn_hidden=16)
    lat = latency_table({"germ": cfg, "germ-dense": cfg.dense_matched()}, repeats=2)
    rows = {r["model"]: r for r in lat.records()}
    assert rows["germ"]["active params"] < rows["germ"]["total params"]
    assert rows["germ-dense"]["latency vs w/o MoE"] == 1.0
    thr = throughput_table({"germ": cfg, "germ-il": cfg}, steps=1, batch_size=4)
    assert [r["model"] for r in thr.records()] == ["germ", "germ-il"]
    assert all(r["transitions/s"] > 0 for r in thr.records())
