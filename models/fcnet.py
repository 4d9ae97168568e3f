"""FCNet (seed 000, Eq. 3): encoder P, L Fourier layers, decoder Q.

    X^1     = P(X^0)                                   P: one Linear (obs [+ rtg] -> hidden)
    Y^l     = gelu(CSC(LN(X^l))) + X^l
    X^{l+1} = FFN(LN(Y^l)) + Y^l                       FFN inner width = hidden, not shared
    actions = Q(X^{L+1})                               Q: Linear -> GELU -> Linear (decoder_hidden)

``step`` runs the same layers at one position (``step_plans.fourier_step``, the speed-only path) with
the CSC's sliding DFT (Eq. 13, csc.py), every layer's state in one (B, L, d, m) complex tensor in the
model's precision.

No positional embedding, no dropout, no final norm (the official implementation). Masked (padding)
steps are zeroed at every CSC input, so left padding equals zero history. With hidden 256, m 10, L 4,
decoder 128 and a 70-D state this is the paper's 787,852 parameters (complex weights counted twice).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quadforge.models.base import Cache, Decoder, FeedForward, SequenceModel
from quadforge.models.csc import CausalSpectralConv, complex_of, weight_key
from quadforge.models.step_plans import ffn_step, fourier_layer_plan, fourier_step, live_params


class FourierLayer(nn.Module):
    def __init__(self, hidden: int, context: int, modes: int, csc_impl: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.csc = CausalSpectralConv(hidden, context, modes, csc_impl)
        self.norm2 = nn.LayerNorm(hidden)
        self.ffn = FeedForward(hidden, hidden)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # x (B, T, d); padding steps enter the CSC as zeros = no history
        y = self.act(self.csc(self.norm1(x) * mask.unsqueeze(-1))) + x
        return self.ffn(self.norm2(y)) + y


class FCNet(SequenceModel):
    name = "fcnet"

    def __init__(self, obs_dim: int, action_dim: int = 12, context: int = 64, modes: int = 10,
                 hidden: int = 256, num_layers: int = 4, decoder_hidden: int = 128, use_rtg: bool = False,
                 csc_impl: str = "kernel"):
        super().__init__(obs_dim, action_dim, context, use_rtg=use_rtg, use_actions=False)
        if num_layers < 1 or hidden < 1 or decoder_hidden < 1:
            raise ValueError(f"fcnet: num_layers, hidden, decoder_hidden must be >= 1, "
                             f"got {num_layers}, {hidden}, {decoder_hidden}")
        self.modes, self.hidden, self.num_layers = modes, hidden, num_layers
        self.decoder_hidden, self.csc_impl = decoder_hidden, csc_impl
        self.encoder = nn.Linear(obs_dim + int(use_rtg), hidden)
        self.layers = nn.ModuleList(FourierLayer(hidden, context, modes, csc_impl) for _ in range(num_layers))
        self.decoder = Decoder(hidden, decoder_hidden, action_dim)
        self._plan: tuple | None = None   # built by the first step; holds live references only
        self._readout: tuple | None = None
        self._readout_key: tuple | None = None

    @property
    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, action_dim=self.action_dim, context=self.context, modes=self.modes,
                    hidden=self.hidden, num_layers=self.num_layers, decoder_hidden=self.decoder_hidden,
                    use_rtg=self.use_rtg, csc_impl=self.csc_impl)

    def _input(self, obs: torch.Tensor, rtg: torch.Tensor | None) -> torch.Tensor:
        return torch.cat([obs, rtg], dim=-1) if self.use_rtg else obs

    def forward(self, obs: torch.Tensor, actions: torch.Tensor | None = None, rtg: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = self.check_window(obs, actions, rtg, mask).to(obs.dtype)
        x = self.encoder(self._input(obs, rtg))                   # (B, T, d)
        for layer in self.layers:
            x = layer(x, mask)
        return self.decoder(x)                                    # (B, T, A)

    def _state_dtype(self) -> torch.dtype:
        # the CSC state's precision is the model's (complex64 for a float32 model): a row's state lives
        # at most one block of n steps before its reset, so rotation rounding cannot accumulate the way
        # it does in an unbounded sliding DFT (csc.py keeps complex128 there); measured at n 1024 and
        # tested (tests/training/test_fcnet_csc.py), docs/models.md
        return complex_of(self.encoder.weight.dtype)

    def _init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        # every layer's CSC state in one tensor (B, L, d, m), kept as Z = (V u) * X (see _step): the
        # history read-out and the Eq. 13 update then run for all layers in one op each
        shape = (batch_size, self.num_layers, self.hidden, self.modes)
        return {"Z": torch.zeros(shape, dtype=self._state_dtype(), device=device)}

    def _csc_readout(self, state_dtype: torch.dtype) -> tuple:
        """(view_as_real(V u) (L, d, 2m), rho as L rows (d,), u as (d, m), the real-part selector
        (1, 0, 1, 0, ...) (2m,)) of every layer's CSC (csc.step_weights) in the model's precision,
        rebuilt whenever any W changed (storage, version or device) or a dtype did."""
        dtype = self._plan[0]["weight"].dtype
        key = tuple([weight_key(p["weight"]) for p in self._plan[1]]) + (state_dtype, dtype)
        if self._readout_key != key:
            if state_dtype != self._state_dtype():
                raise ValueError(f"fcnet: the cache holds a {state_dtype} state but the model is {dtype}; "
                                 f"call init_cache again after changing the model's dtype")
            with torch.no_grad():
                parts = [layer.csc.step_weights() for layer in self.layers]
                vu = torch.view_as_real(torch.stack([w for w, _ in parts])).flatten(-2)     # (L, d, 2m)
                u = self.layers[0].csc.u               # every layer has the same n and m
                real = torch.empty((), dtype=state_dtype).real.dtype   # float32 also for a bf16 model
                # u spelled out per channel: the update's inner loop then runs over d*m, not over m
                self._readout = (vu.to(real), tuple(rho.to(dtype) for _, rho in parts),
                                 u.expand(self.hidden, self.modes).to(state_dtype).contiguous(),
                                 torch.tensor([1.0, 0.0], dtype=real, device=u.device).repeat(self.modes))
            self._readout_key = key
        return self._readout

    def _step(self, obs_t: torch.Tensor, cache: Cache, action_prev: torch.Tensor,
              rtg_t: torch.Tensor | None) -> torch.Tensor:
        """Eq. 13 for all layers with the state kept as Z = (V u) * X (per channel and mode). From
        X(t) = u (X(t-1) + f_t):  y_t = Re(sum_l Z_l(t-1)) + rho f_t  and  Z(t) = u (Z(t-1) + (V u) f_t),
        so the history read-out is a plain sum of real parts (one matmul for every layer) and the
        update one real multiply-add on the state's real view plus the rotation. Like X, Z belongs to
        the weights it was filled with: after a weight update start a new cache (f depends on the
        weights anyway)."""
        if self._plan is None:
            q1, _, q2 = self.decoder
            self._plan = (live_params(self.encoder), [live_params(layer.csc) for layer in self.layers],
                          [fourier_layer_plan(layer) for layer in self.layers], live_params(q1), live_params(q2))
        p, _, layers, q1, q2 = self._plan
        Z = cache.state["Z"]                                                                 # (B, L, d, m)
        vu, rho, u, real_parts = self._csc_readout(Z.dtype)
        z = torch.view_as_real(Z).flatten(-2)                                                # (B, L, d, 2m)
        history = torch.matmul(z, real_parts)                                                # (B, L, d)
        x = F.linear(self._input(obs_t, rtg_t), p["weight"], p["bias"])                      # (B, d)
        if history.dtype != x.dtype:   # half-precision models keep a complex64 state
            history = history.to(x.dtype)
        inputs = []
        for plan, h, r in zip(layers, history.unbind(1), rho):
            x, f = fourier_step(x, plan, h, r)
            inputs.append(f)
        z.addcmul_(torch.stack(inputs, 1).unsqueeze(-1), vu)    # Z + (V u) f, every layer at once
        Z.mul_(u)
        return ffn_step(x, q1, q2)                                                           # (B, A)
