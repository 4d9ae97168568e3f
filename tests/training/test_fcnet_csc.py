"""FCNet's causal spectral convolution: FFT-parallel == modes (Eq. 12) == naive Eq. 5-7 == recurrent."""
import pytest
import torch

from quadforge.models.csc import CausalSpectralConv
from quadforge.models.fcnet import FCNet

torch.set_num_threads(1)


@pytest.mark.parametrize("n,m", [(16, 5), (15, 8), (64, 10), (7, 1)])
def test_parallel_paths_match_naive_and_recurrent(n, m):
    torch.manual_seed(n * 100 + m)
    csc = CausalSpectralConv(dim=6, context=n, modes=m)
    x = torch.randn(3, n, 6)
    ref = csc.naive(x)                                           # includes the first n-1 (zero-history) steps
    with torch.no_grad():
        fft_kernel = csc(x)
        fft_modes = csc.forward_modes(x)
    csc.impl = "direct"
    with torch.no_grad():
        direct = csc(x)
    state = csc.init_state(3, torch.device("cpu"))
    rec = torch.stack([csc.step(x[:, t], state) for t in range(n)], dim=1)
    for got in (fft_kernel, fft_modes, direct, rec):
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
    # shorter windows (a block's first steps) too
    with torch.no_grad():
        assert torch.allclose(CausalSpectralConv.forward(csc, x[:, :5]), ref[:, :5], atol=1e-5)


def _sliding_drift(steps: int) -> float:
    torch.manual_seed(1)
    n, d = 64, 8
    csc = CausalSpectralConv(dim=d, context=n, modes=10)
    state = csc.init_state(1, torch.device("cpu"), sliding=True)
    x = torch.randn(steps, 1, d)
    worst = 0.0
    checks = {steps - 1, steps // 2, n - 1, n + 3}
    for t in range(steps):
        y = csc.step(x[t], state)
        if t in checks:   # reference: Eq. 5-7 over exactly the last n inputs, float64
            window = x[max(0, t - n + 1):t + 1, 0].unsqueeze(0)
            ref = csc.naive(window.double())[:, -1]
            worst = max(worst, float((y.double() - ref).abs().max()))
    return worst


def test_recurrent_drift_1e4_steps():
    assert _sliding_drift(10_000) < 1e-5


@pytest.mark.slow
def test_recurrent_drift_1e5_steps():
    assert _sliding_drift(100_000) < 1e-4


def test_fcnet_matches_paper_parameter_count():
    # seed 000 Table 7: 787,852 trainable parameters (4 layers, m 10, hidden 256, decoder 128, 70-D state)
    assert FCNet(obs_dim=70, action_dim=12).num_parameters() == 787_852


def test_bad_sizes_are_clear_errors():
    with pytest.raises(ValueError, match=r"m=9 must satisfy 1 <= m <= \(n\+1\)//2 = 8"):
        FCNet(obs_dim=4, context=16, modes=9)
    with pytest.raises(ValueError, match="csc_impl"):
        FCNet(obs_dim=4, context=16, modes=2, csc_impl="fast")
    model = FCNet(obs_dim=4, action_dim=2, context=8, modes=2, hidden=8, num_layers=1)
    with pytest.raises(ValueError, match="window length 9 exceeds the model context 8"):
        model(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match=r"obs must be \(B, T, 4\)"):
        model(torch.zeros(1, 8, 5))
    cache = model.init_cache(2)
    with pytest.raises(ValueError, match="cache was built for batch size 2"):
        model.step(torch.zeros(3, 4), cache)


def test_recurrent_readout_follows_weight_updates():
    """The precomputed W@c must never go stale: after an optimizer step (in place) or a
    load_state_dict the recurrent path agrees with the parallel one again."""
    torch.manual_seed(0)
    model = FCNet(obs_dim=5, action_dim=2, context=8, modes=3, hidden=8, num_layers=2, decoder_hidden=8)
    x = torch.randn(2, 8, 5)

    def agree() -> bool:
        cache = model.init_cache(2)
        rec = torch.stack([model.step(x[:, t], cache) for t in range(8)], 1)
        with torch.no_grad():
            return torch.allclose(rec, model(x), atol=1e-5)

    assert agree()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(x).pow(2).mean().backward()
    opt.step()
    assert agree()
    other = FCNet(obs_dim=5, action_dim=2, context=8, modes=3, hidden=8, num_layers=2, decoder_hidden=8)
    model.load_state_dict(other.state_dict())
    assert agree()


def test_block_state_in_model_precision_holds_over_a_long_block():
    """A float32 FCNet keeps its CSC state in complex64 (one block of n steps, then a reset): over a
    whole n = 1024 block its step stays within 1e-5 of the float64 forward pass."""
    torch.manual_seed(0)
    n = 1024
    model = FCNet(obs_dim=7, action_dim=3, context=n, modes=10, hidden=16, num_layers=2, decoder_hidden=8).eval()
    x = torch.randn(2, n, 7)
    cache = model.init_cache(2)
    assert cache.state["Z"].dtype == torch.complex64
    rec = torch.stack([model.step(x[:, t], cache) for t in range(n)], 1)
    reference = FCNet(obs_dim=7, action_dim=3, context=n, modes=10, hidden=16, num_layers=2, decoder_hidden=8)
    reference.load_state_dict(model.state_dict())
    reference.double().eval()
    with torch.no_grad():
        ref = reference(x.double())
    assert (rec.double() - ref).abs().max() < 1e-5
    assert reference.init_cache(1).state["Z"].dtype == torch.complex128   # float64 model, complex128 state


def test_cache_of_another_dtype_is_a_clear_error():
    model = FCNet(obs_dim=4, action_dim=2, context=8, modes=2, hidden=8, num_layers=1, decoder_hidden=8)
    cache = model.init_cache(1)
    model.step(torch.zeros(1, 4), cache)
    model.double()
    with pytest.raises(ValueError, match="call init_cache again after changing the model's dtype"):
        model.step(torch.zeros(1, 4, dtype=torch.float64), cache)
    fresh = model.init_cache(1)
    assert model.step(torch.zeros(1, 4, dtype=torch.float64), fresh).dtype == torch.float64


def test_bfloat16_model_steps_with_a_complex64_state():
    """A half-precision model keeps a complex64 state (no complex bf16) and casts the read-out."""
    torch.manual_seed(0)
    model = FCNet(obs_dim=5, action_dim=2, context=8, modes=3, hidden=8, num_layers=2, decoder_hidden=8).eval()
    x = torch.randn(1, 8, 5)
    with torch.no_grad():
        ref = model(x)
    model.bfloat16()   # floating-point parameters only: the complex CSC weights stay complex
    cache = model.init_cache(1)
    assert cache.state["Z"].dtype == torch.complex64
    out = torch.stack([model.step(x[:, t].bfloat16(), cache) for t in range(8)], 1)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 2e-2


@pytest.mark.parametrize("impl", ["kernel", "direct", "modes"])
def test_a_float64_layer_is_the_literal_equations_in_float64(impl):
    """Every path mixes in the complex type of its input: a float64 layer equals Eq. 5-7 to float64 rounding
    (it was within 1e-7 only, its modes mixed in complex64), and a float32 one to float32 rounding."""
    torch.manual_seed(0)
    csc = CausalSpectralConv(8, 64, 12, impl=impl).double()
    x = torch.randn(2, 64, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (csc(x) - csc.naive(x)).abs().max() < 1e-12
        assert (csc.float()(x.float()).double() - csc.naive(x)).abs().max() < 1e-5
