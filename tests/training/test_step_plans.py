"""The deployment step's fast paths: native exact GELU, live step plans, the real CSC read-out."""
import pytest
import torch
import torch.nn.functional as F

from quadforge.models import build_model
from quadforge.models.csc import CausalSpectralConv

torch.set_num_threads(1)
D, A, N, B = 7, 3, 8, 2

CONFIGS = {
    "fcnet": dict(modes=3, hidden=16, num_layers=2, decoder_hidden=8),
    "transformer": dict(hidden=16, num_heads=2, num_layers=2),
}


def _exact_gelu64(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))


def test_step_gelu_is_exact_gelu_to_float32_rounding():
    """step disables oneDNN so F.gelu runs ATen's vectorised erf kernel: the same exact GELU."""
    x = torch.linspace(-8, 8, 100_001)
    ref = _exact_gelu64(x)
    onednn = F.gelu(x)
    torch.backends.mkldnn.enabled = False
    try:
        native = F.gelu(x)
        native_small = F.gelu(x[40_000:40_256].clone())          # deployment sizes take the same path
    finally:
        torch.backends.mkldnn.enabled = True
    # 0.5 x (1 + erf(x/sqrt2)) in float32 carries an error of a few eps*|x| (cancellation in the
    # negative tail). The promise (docs/models.md) is this bound for the path `step` uses; how close
    # oneDNN's kernel comes, and which of the two is closer, depends on the CPU's vector width (AVX2 vs
    # AVX-512), so neither is asserted - only that oneDNN's is the same function to a loose tolerance.
    eps = torch.finfo(torch.float32).eps
    bound = 2 * eps * x.double().abs().clamp_min(1)
    assert bool(((native.double() - ref).abs() <= bound).all())
    assert bool(((onednn.double() - ref).abs() <= 64 * bound).all())
    assert torch.equal(native_small, native[40_000:40_256])


def test_step_restores_the_onednn_flag_also_on_error():
    model = build_model("fcnet", obs_dim=D, action_dim=A, context=N, **CONFIGS["fcnet"])
    cache = model.init_cache(B)
    assert torch.backends.mkldnn.enabled
    model.step(torch.zeros(B, D), cache)
    assert torch.backends.mkldnn.enabled
    with pytest.raises(RuntimeError):
        model._step = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))   # fails inside the toggle
        model.step(torch.zeros(B, D), cache)
    assert torch.backends.mkldnn.enabled


def _agree(model, obs, dtype=torch.float32) -> bool:
    """step == forward over a full block, for a freshly built cache."""
    obs = obs.to(dtype)
    cache = model.init_cache(obs.shape[0])
    with torch.no_grad():
        rec = torch.stack([model.step(obs[:, t], cache) for t in range(obs.shape[1])], 1)
        ref = model(obs, torch.zeros(*obs.shape[:2], A, dtype=dtype) if model.use_actions else None)
    return torch.allclose(rec, ref, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_step_plan_follows_every_kind_of_parameter_change(name):
    """The plan is built by the first step and kept; it must never serve a stale weight after an
    optimizer step, load_state_dict (copying or assigning), or a dtype change."""
    torch.manual_seed(0)
    model = build_model(name, obs_dim=D, action_dim=A, context=N, **CONFIGS[name]).eval()
    obs = torch.randn(B, N, D, generator=torch.Generator().manual_seed(1))
    assert _agree(model, obs)

    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(obs, torch.zeros(B, N, A) if model.use_actions else None).pow(2).mean().backward()
    opt.step()
    assert _agree(model, obs)

    torch.manual_seed(5)
    other = build_model(name, obs_dim=D, action_dim=A, context=N, **CONFIGS[name])
    model.load_state_dict(other.state_dict())
    assert _agree(model, obs)

    torch.manual_seed(6)
    third = build_model(name, obs_dim=D, action_dim=A, context=N, **CONFIGS[name])
    model.load_state_dict({k: v.clone() for k, v in third.state_dict().items()}, assign=True)
    assert _agree(model, obs)
    cache = model.init_cache(B)
    assert torch.equal(model.step(obs[:, 0], cache), third.eval().step(obs[:, 0], third.init_cache(B)))

    if name == "fcnet":   # the KV caches are float32 by construction; FCNet's step follows the dtype
        model.double()
        assert _agree(model, obs, torch.float64)


def test_split_real_readout_is_the_complex_readout():
    """y_t = R . view_as_real(X(t-1)) + rho f_t (R = view_as_real(conj(V u)), rho = Re sum V u) is
    Re(sum_l V_l X_l(t)) of the updated state, to float64 rounding."""
    torch.manual_seed(3)
    csc = CausalSpectralConv(dim=12, context=32, modes=7)
    state = csc.init_state(4, torch.device("cpu"))
    x = torch.randn(20, 4, 12, dtype=torch.float64)
    v = csc.readout(torch.cdouble)                                  # (m, d)
    for t in range(20):
        y = csc.step(x[t], state)
        ref = torch.einsum("ld,bdl->bd", v, state["X"]).real
        assert y.dtype == torch.float64
        assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    assert csc.step(x[0].float(), state).dtype == torch.float32   # float32 in, float32 out


def test_layer_steps_are_their_reference_forward_on_a_first_position():
    """Each speed-only step of models/step_plans.py against its layer's forward, one layer at a
    time (the model-level step == forward is tests/training/test_models.py)."""
    from quadforge.models.fcnet import FourierLayer
    from quadforge.models.step_plans import block_plan, block_step, fourier_layer_plan, fourier_step
    from quadforge.models.transformer import Block
    torch.manual_seed(3)
    x = torch.randn(B, 16)
    layer = FourierLayer(16, N, 3, "kernel").eval()
    with torch.no_grad():
        _, rho = layer.csc.step_weights()
        got, _ = fourier_step(x.clone(), fourier_layer_plan(layer), torch.zeros(B, 16), rho.to(x.dtype))
        torch.testing.assert_close(got, layer(x[:, None], torch.ones(B, 1))[:, 0], rtol=1e-5, atol=1e-5)
        block = Block(16, 2, 4).eval()
        keys, values = torch.zeros(B, 2, 2, 8), torch.zeros(B, 2, 2, 8)   # slot 0 and the scratch slot
        allowed = torch.tensor([True, False]).expand(B, 1, 1, 2)
        got = block_step(x[:, None].clone(), block_plan(block), keys, values, torch.arange(B)[:, None],
                         torch.zeros(B, 1, dtype=torch.long), allowed)
        torch.testing.assert_close(got, block(x[:, None], torch.ones(B, 1, 1, 1, dtype=torch.bool)),
                                   rtol=1e-5, atol=1e-5)
