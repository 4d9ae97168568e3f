"""Every model of the zoo: causality, step == forward, left padding == zero history, block resets."""
import pytest
import torch

from quadforge.models import build_model
from quadforge.models.registry import model_names

torch.set_num_threads(1)
D, A, N, B = 7, 3, 8, 3

CONFIGS = {
    "fcnet": dict(modes=3, hidden=16, num_layers=2, decoder_hidden=8, csc_impl="direct"),
    "fcnet_fft": dict(modes=3, hidden=16, num_layers=2, decoder_hidden=8),
    "transformer": dict(hidden=16, num_heads=2, num_layers=2),
    "transformer_dt": dict(hidden=16, num_heads=2, num_layers=2, use_actions=True, use_rtg=True),
    "convformer": dict(hidden=16, num_layers=2, use_actions=True),
    "convformer_rtg": dict(hidden=16, num_layers=2, use_actions=True, use_rtg=True),
    "starformer": dict(hidden=16, local_dim=8, num_heads=2, num_layers=2),
    "starformer_rtg": dict(hidden=16, local_dim=8, num_heads=2, num_layers=2, use_rtg=True),
    "mlp": dict(hidden=16),
    "mlp_rtg": dict(hidden=16, use_rtg=True),
}


def _model(key):
    torch.manual_seed(0)
    return build_model(key.split("_")[0], obs_dim=D, action_dim=A, context=N, **CONFIGS[key]).eval()


def _window(t=N, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, t, D, generator=g), torch.randn(B, t, A, generator=g), torch.randn(B, t, 1, generator=g)


def _fwd(model, obs, act, rtg, mask=None):
    with torch.no_grad():
        return model(obs, act if model.use_actions else None, rtg if model.use_rtg else None, mask)


def _steps(model, obs, act, rtg, cache=None):
    cache = cache or model.init_cache(obs.shape[0])
    out = []
    for t in range(obs.shape[1]):
        prev = act[:, t - 1] if t > 0 else torch.zeros(obs.shape[0], A)
        out.append(model.step(obs[:, t], cache, prev, rtg[:, t] if model.use_rtg else None))
    return torch.stack(out, 1), cache


def test_registry_covers_the_zoo():
    assert set(model_names(trainer="imitation")) == {"fcnet", "transformer", "convformer", "starformer", "mlp"}
    with pytest.raises(ValueError, match="model 'rnn' unknown"):
        build_model("rnn", obs_dim=3)
    with pytest.raises(ValueError, match="bad config for model 'mlp'"):
        build_model("mlp", obs_dim=3, width=4)


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_causal(key):
    model = _model(key)
    obs, act, rtg = _window()
    base = _fwd(model, obs, act, rtg)
    exact = key != "fcnet_fft"   # an FFT spreads rounding (not information) over all positions
    for t in (0, 3, N - 1):
        for which in ("obs", "act", "rtg"):
            o, a, r = obs.clone(), act.clone(), rtg.clone()
            {"obs": o, "act": a, "rtg": r}[which][:, t] += 10.0
            out = _fwd(model, o, a, r)
            # actions at t only inform predictions after t (teacher-forced action tokens)
            stop = t + 1 if which == "act" else t
            if exact:
                assert torch.equal(out[:, :stop], base[:, :stop]), (which, t)
            else:
                assert torch.allclose(out[:, :stop], base[:, :stop], atol=1e-5), (which, t)
            if which == "obs":
                assert not torch.allclose(out[:, t], base[:, t])   # and t itself does see obs_t


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_step_equals_forward_and_left_padding_is_zero_history(key):
    model = _model(key)
    obs, act, rtg = _window()
    full = _fwd(model, obs, act, rtg)
    stepped, _ = _steps(model, obs, act, rtg)
    assert torch.allclose(stepped, full, atol=1e-5), (stepped - full).abs().max()
    pad = 3   # the sampler's left padding: zeros with mask False
    z = lambda x: torch.cat([torch.zeros(B, pad, x.shape[-1]), x[:, :N - pad]], 1)
    mask = (torch.arange(N) >= pad).expand(B, N)
    padded = _fwd(model, z(obs), z(act), z(rtg), mask)
    assert torch.allclose(padded[:, pad:], full[:, :N - pad], atol=1e-5)
    short = _fwd(model, obs[:, :5], act[:, :5], rtg[:, :5])     # a shorter window is the same prefix
    assert torch.allclose(short, full[:, :5], atol=1e-5)


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_step_runs_in_the_models_precision(key):
    """The deployment caches follow the model's dtype: a float64 model's step equals its float64 forward
    (float32 caches were a dtype error in the token models' step)."""
    model = _model(key).double()
    obs, act, rtg = (x.double() for x in _window())
    full = _fwd(model, obs, act, rtg)
    cache = model.init_cache(B)
    assert all(t.dtype == torch.float64 for t in cache.state.values() if t.is_floating_point())
    out = []
    for t in range(N):
        prev = act[:, t - 1] if t > 0 else torch.zeros(B, A, dtype=torch.float64)
        out.append(model.step(obs[:, t], cache, prev, rtg[:, t] if model.use_rtg else None))
    stepped = torch.stack(out, 1)
    assert stepped.dtype == torch.float64 and torch.allclose(stepped, full, atol=1e-6)


@pytest.mark.parametrize("key", ["fcnet", "transformer_dt", "convformer", "starformer", "mlp"])
def test_blocks_and_per_env_resets(key):
    model = _model(key)
    obs, act, rtg = _window(t=2 * N + 2)
    stepped, cache = _steps(model, obs, act, rtg)
    # every context steps the cache restarts: the second block equals a fresh window
    second = _fwd(model, obs[:, N:2 * N], act[:, N:2 * N], rtg[:, N:2 * N])
    assert torch.allclose(stepped[:, N:2 * N], second, atol=1e-5)
    # resetting one env mid-block restarts only that env
    cache = model.init_cache(B)
    head, cache = _steps(model, obs[:, :4], act[:, :4], rtg[:, :4], cache)
    model.reset_cache(cache, torch.tensor([1]))
    tail = []
    for t in range(4, 8):
        prev = act[:, t - 1].clone()
        tail.append(model.step(obs[:, t], cache, prev, rtg[:, t] if model.use_rtg else None))
    tail = torch.stack(tail, 1)
    whole = _fwd(model, obs[:, :8], act[:, :8], rtg[:, :8])
    fresh = _fwd(model, obs[:, 4:8], act[:, 4:8], rtg[:, 4:8])
    assert torch.allclose(tail[[0, 2]], whole[[0, 2], 4:8], atol=1e-5)
    assert torch.allclose(tail[1], fresh[1], atol=1e-5)


@pytest.mark.parametrize("key", ["fcnet", "transformer", "convformer", "starformer", "mlp"])
def test_config_rebuilds_the_same_model(key):
    model = _model(key)
    twin = build_model(model.name, **model.config)
    twin.load_state_dict(model.state_dict())
    obs, act, rtg = _window()
    assert torch.equal(_fwd(model, obs, act, rtg), _fwd(twin.eval(), obs, act, rtg))


def test_missing_conditioning_inputs_are_clear():
    model = _model("transformer_dt")
    obs, act, rtg = _window()
    with pytest.raises(ValueError, match="use_actions=True needs actions"):
        model(obs, None, rtg)
    with pytest.raises(ValueError, match="use_rtg=True needs rtg"):
        model(obs, act, None)
    with pytest.raises(ValueError, match="use_rtg=True needs rtg_t"):
        model.step(obs[:, 0], model.init_cache(B))
