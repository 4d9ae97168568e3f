"""Sparse MoE: routing (exactly k experts, gates sum to 1), batched dispatch == dense reference,
eval-mode determinism (no noise), balance losses, parameter counts, matched dense width."""
import pytest
import torch

from quadforge.models.moe import DenseFFN, MoEConfig, SparseMoE, cv_squared, matched_dense_hidden

torch.set_num_threads(1)


def _moe(**kw) -> SparseMoE:
    torch.manual_seed(0)
    m = SparseMoE(MoEConfig(dim=8, hidden=16, **kw))
    with torch.no_grad():  # non-zero router so routing differs per token
        m.w_gate.normal_(0, 1.0)
        m.w_noise.normal_(0, 0.5)
    return m


def test_exactly_k_experts_and_gates_sum_to_one():
    m = _moe(num_experts=8, top_k=2).train()
    out = m(torch.randn(5, 7, 8))
    assert out.y.shape == (5, 7, 8)
    assert out.expert_index.shape == (35, 2) and out.gates.shape == (35, 2)
    # two distinct experts per token
    assert (out.expert_index[:, 0] != out.expert_index[:, 1]).all()
    torch.testing.assert_close(out.gates.sum(-1), torch.ones(35))
    assert (out.gates > 0).all()


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("tokens", [1, 2, 20])   # <= E (token, slot) pairs take the gathered path
def test_output_equals_dense_weighted_sum_of_selected_experts(train, tokens):
    m = _moe(num_experts=4, top_k=2).train(train)
    x = torch.randn(tokens, 8)
    torch.manual_seed(1)
    out = m(x)
    every = torch.stack([m.expert_forward(x, e) for e in range(4)], dim=1)   # (T, E, D)
    picked = every.gather(1, out.expert_index[:, :, None].expand(-1, -1, 8))  # (T, k, D)
    if train:
        out.y.sum().backward()   # both dispatch paths keep every expert in the graph (DDP)
        assert m.w1.grad is not None and m.w2.grad is not None
    expected = (picked * out.gates[:, :, None]).sum(1)
    torch.testing.assert_close(out.y, expected, rtol=1e-5, atol=1e-6)


def test_gates_are_softmax_over_clean_topk_logits_in_eval():
    m = _moe(num_experts=6, top_k=3).eval()
    x = torch.randn(10, 8)
    out = m(x)
    logits = x @ m.w_gate
    top = logits.topk(3, dim=-1)
    assert torch.equal(out.expert_index, top.indices)
    torch.testing.assert_close(out.gates, torch.softmax(top.values, -1))


def test_router_losses_only_in_training():
    m = _moe()
    x = torch.randn(64, 8)
    assert float(m.eval()(x).aux_loss) == 0.0
    assert float(m.train()(x).aux_loss.detach()) > 0.0


def test_no_noise_in_eval_mode_noise_in_training():
    m = _moe()
    x = torch.randn(64, 8)
    m.eval()
    torch.manual_seed(1); a = m(x)
    torch.manual_seed(2); b = m(x)
    assert torch.equal(a.y, b.y) and torch.equal(a.expert_index, b.expert_index)
    m.train()
    torch.manual_seed(1); c = m(x)
    torch.manual_seed(2); d = m(x)
    assert not torch.equal(c.gates, d.gates)


def test_gradients_reach_router_and_experts():
    m = _moe().train()
    out = m(torch.randn(32, 8))
    (out.y.pow(2).mean() + out.aux_loss).backward()
    for name in ("w_gate", "w_noise", "w1", "w2"):
        assert getattr(m, name).grad is not None and getattr(m, name).grad.abs().sum() > 0, name


def _routing(m: SparseMoE, skew: bool, t: int = 64):
    """Hand-made routing: uniform (token j -> experts j, j+1 mod E) or skewed (every token -> 0, 1)."""
    e, k = m.cfg.num_experts, m.cfg.top_k
    clean = torch.zeros(t, e)
    idx = torch.stack([(torch.arange(t) + s) % e for s in range(k)], 1) if not skew else \
        torch.arange(k).expand(t, k).clone()
    clean.scatter_(1, idx, 5.0)
    gates = torch.full((t, k), 1.0 / k)
    dense = torch.zeros(t, e).scatter(1, idx, gates)
    return clean, idx, dense


@pytest.mark.parametrize("balance", ["cv2", "switch"])
def test_balance_loss_minimal_uniform_larger_skewed(balance):
    m = _moe(balance=balance).eval()
    c, i, d = _routing(m, skew=False)
    uniform = m.balance_loss(c, c, None, i, d)
    c, i, d = _routing(m, skew=True)
    skewed = m.balance_loss(c, c, None, i, d)
    if balance == "cv2":
        assert float(uniform) == pytest.approx(0.0, abs=1e-6)
    else:  # Switch/Mixtral loss equals top_k under uniform routing
        assert float(uniform) == pytest.approx(m.cfg.top_k, rel=0.05)
    assert float(skewed) > float(uniform) + 0.5


def test_noisy_load_estimate_is_differentiable_and_sums_near_tokens_times_k():
    m = _moe(num_experts=8, top_k=2).train()
    x = torch.randn(256, 8)
    clean, noisy, std, idx = m.route(x)
    load = m._load(clean, noisy, std, idx)
    assert load.requires_grad
    assert float(load.detach().sum()) == pytest.approx(256 * 2, rel=0.25)


def test_cv_squared():
    assert float(cv_squared(torch.ones(5))) == 0.0
    assert float(cv_squared(torch.tensor([1.0, 0.0]))) == pytest.approx(1.0)


def test_parameter_counts_and_matched_dense():
    cfg = MoEConfig(dim=32, hidden=64, num_experts=8, top_k=2)
    m = SparseMoE(cfg)
    per_expert = 32 * 64 + 64 + 64 * 32 + 32
    assert m.expert_parameters() == per_expert
    assert m.total_parameters() == 8 * per_expert + 2 * 32 * 8
    assert m.active_parameters() == 2 * per_expert + 2 * 32 * 8
    dense = DenseFFN(32, matched_dense_hidden(cfg))
    assert abs(dense.total_parameters() - m.active_parameters()) <= 2 * 32 + 1


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="top_k"):
        SparseMoE(MoEConfig(dim=4, hidden=4, num_experts=2, top_k=3))
    with pytest.raises(ValueError, match="balance"):
        SparseMoE(MoEConfig(dim=4, hidden=4, balance="nope"))


def test_an_upcycled_moe_computes_what_the_dense_ffn_did_until_trained():
    from quadforge.models.moe import upcycled_state
    torch.manual_seed(0)
    dense = DenseFFN(8, 12)
    moe = SparseMoE(MoEConfig(dim=8, hidden=12, num_experts=4, top_k=2))
    wrapped_dense, wrapped_moe = torch.nn.ModuleDict({"ffn": dense}), torch.nn.ModuleDict({"ffn": moe})
    wrapped_moe.load_state_dict(upcycled_state(wrapped_dense.state_dict(), wrapped_moe.state_dict()))
    x = torch.randn(5, 7, 8)
    for mode in (False, True):                   # eval and noisy training routing alike
        moe.train(mode)
        assert torch.allclose(moe(x).y, dense(x).y, atol=1e-6)
    assert torch.equal(moe.w_gate, torch.zeros_like(moe.w_gate))
    narrow = torch.nn.ModuleDict({"ffn": SparseMoE(MoEConfig(dim=8, hidden=6, num_experts=4, top_k=2))})
    with pytest.raises(ValueError, match="width must equal the dense FFN's"):
        upcycled_state(wrapped_dense.state_dict(), narrow.state_dict())
