"""FCNet's causal spectral convolution (CSC), seed 000 Eq. 5-13.

For an input window x_{t-n+1..t} (d channels, zero history before the window):

    X_k(t) = sum_{i<n} x_{t-n+1+i} e^{-2 pi j k i / n}          (DFT, k < m lowest modes)   Eq. 5, 7
    Y_k    = sum_l W[k, l] X_l            (complex mode mixing, per channel: W is (m, m, d))    Eq. 5
    y_t    = Re( sum_k c_k Y_k ),  c_0 = 1/n,  c_k = (2/n) e^{2 pi j k (n-1)/n}                  Eq. 6, 7

(the inverse DFT at the window's last position of the conjugate-symmetric extension; m <= (n+1)//2
so no mode is its own mirror). Writing V = W^T c ("W @ c", (m, d)) the output is
y_t = Re(sum_l V_l X_l(t)).

Three equivalent evaluations, tested against each other:
- ``naive``: Eq. 5-7 literally, O(n^2) per window, float64 - the reference.
- ``modes``: Eq. 10-12, each mode's X_k(t) = sum_j u_k^{j+1} f_{t-j} (u_k = e^{2 pi j k/n}, f = the
  differences against zero history, = x inside one window) as a causal FFT convolution,
  O(m d T log T), then the mixing and the readout.
- ``direct``: the same real kernel applied by a direct depthwise convolution, O(d T^2): bit-exactly
  causal (an FFT mixes rounding across positions), for checks and very short windows.
- ``kernel`` (default for training): because W mixes modes per channel and the readout is linear,
  the whole block is a real depthwise causal convolution with h_j = Re(sum_l V_l u_l^{j+1}); one FFT
  convolution, O(d T log T) after an O(m d T) kernel build. Same operator, less memory.

Recurrent (Eq. 13, sliding DFT): X <- u * (X + x_t - x_{t-n}), y = Re(sum_l V_l X_l), O(m d) per step.
The state is complex128 so its random-walk rounding drift stays ~1e-13 (float32 drifts to ~1e-4 over
3e5 steps). It is laid out (B, d, m) so that its real view is (B, d, 2m) with every channel's modes
contiguous. The read-out is split (``step_readout``): y_t = Re(sum_l V_l u_l X_l(t-1)) + rho f_t, the
first term one real dot product per channel of the previous state's real view against
R = view_as_real(conj(V u)) (d, 2m) - no complex product, no strided reduction, and it does not wait
for x_t (FCNet's block state is Z = (V u) X instead, so its read-out of every layer is one matmul).
R and rho are cached and rebuilt automatically whenever W changes (keyed on the parameter's storage
and in-place version counter), so a stale readout can never be used silently.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

CSC_IMPLS = ("kernel", "modes", "direct")


def weight_key(w: torch.Tensor) -> tuple:
    """What a cached read-out depends on: the weight's storage, in-place version counter and device
    (an optimizer step or load_state_dict bumps the version; .to() or assign=True changes the storage)."""
    return (w.data_ptr(), w._version, w.device)


def check_modes(context: int, modes: int) -> None:
    limit = (context + 1) // 2
    if not 1 <= modes <= limit:
        raise ValueError(f"FCNet modes m={modes} must satisfy 1 <= m <= (n+1)//2 = {limit} for context n={context}")


def complex_of(dtype: torch.dtype) -> torch.dtype:
    """The complex type that carries ``dtype``'s precision: complex128 for float64, else complex64."""
    return torch.promote_types(dtype, torch.complex64)


def causal_fft_conv(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """y_t = sum_{j<=t} h_j * x_{t-j} per channel. x (B, T, d) real, h (T, d) real -> (B, T, d)."""
    t = x.shape[1]
    size = 2 * t  # zero-padding to 2T turns the circular convolution into a linear one
    # FFT over a contiguous last axis: ~3x faster on the CPU than over the strided time axis
    xf = torch.fft.rfft(x.transpose(1, 2).contiguous(), n=size, dim=-1)          # (B, d, T+1)
    hf = torch.fft.rfft(h.t().contiguous(), n=size, dim=-1)                       # (d, T+1)
    return torch.fft.irfft(xf * hf, n=size, dim=-1)[..., :t].transpose(1, 2)      # (B, T, d)


class CausalSpectralConv(nn.Module):
    def __init__(self, dim: int, context: int, modes: int, impl: str = "kernel"):
        super().__init__()
        check_modes(context, modes)
        if impl not in CSC_IMPLS:
            raise ValueError(f"FCNet csc_impl={impl!r}; allowed: {CSC_IMPLS}")
        self.dim, self.context, self.modes, self.impl = dim, context, modes, impl
        # W[k, l, d]: Y_k = sum_l W[k, l] X_l per channel d; official init randn(cfloat)/m
        self.weight = nn.Parameter(torch.randn(modes, modes, dim, dtype=torch.cfloat) / modes)
        k = torch.arange(modes, dtype=torch.float64)
        u = torch.polar(torch.ones_like(k), 2 * math.pi * k / context)                     # (m,)
        c = torch.polar(torch.full_like(k, 2.0 / context), 2 * math.pi * k * (context - 1) / context)
        c[0] = 1.0 / context
        self.register_buffer("u", u, persistent=False)                                     # complex128
        self.register_buffer("c", c, persistent=False)
        self._readout: tuple[torch.Tensor, torch.Tensor] | None = None
        self._readout_key: tuple | None = None

    # --- shared pieces ------------------------------------------------------------------------------
    def readout(self, dtype: torch.dtype = torch.cdouble) -> torch.Tensor:
        """V = W^T c, (m, d): the mixing and the inverse DFT at the last position folded together."""
        return torch.einsum("k,kld->ld", self.c.to(dtype), self.weight.to(dtype))

    def kernel(self, length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The equivalent real causal kernel h_j, (length, d), computed in the complex type of ``dtype`` (the
        input's: complex64 for float32, complex128 for float64, so a float64 model is float64 throughout)."""
        c = complex_of(dtype)
        j = torch.arange(1, length + 1, dtype=torch.float64, device=self.u.device)
        powers = torch.polar(torch.ones(length, self.modes, dtype=torch.float64, device=self.u.device),
                             torch.outer(j, torch.angle(self.u)))                          # (T, m) u^{j+1}
        v = self.readout(c)                                                                # (m, d)
        return (powers.to(c) @ v).real                                                     # (T, d)

    # --- parallel -----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) with T <= n, zero history before position 0 -> (B, T, d)."""
        if x.shape[1] > self.context:
            raise ValueError(f"CSC window length {x.shape[1]} exceeds context n={self.context}")
        if self.impl == "kernel":
            return causal_fft_conv(x, self.kernel(x.shape[1], x.dtype).to(x.dtype))
        if self.impl == "direct":
            t = x.shape[1]
            w = self.kernel(t, x.dtype).to(x.dtype).flip(0).t().unsqueeze(1)              # (d, 1, T)
            return F.conv1d(F.pad(x.transpose(1, 2), (t - 1, 0)), w, groups=self.dim).transpose(1, 2)
        return self.forward_modes(x)

    def forward_modes(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 10-12: every mode's sliding DFT by one FFT convolution, then mixing and readout."""
        b, t, d = x.shape
        size, c = 2 * t, complex_of(x.dtype)
        j = torch.arange(1, t + 1, dtype=torch.float64, device=x.device)
        a = torch.polar(torch.ones(t, self.modes, dtype=torch.float64, device=x.device),
                        torch.outer(j, torch.angle(self.u))).to(c)                         # (T, m) A_i
        xf = torch.fft.fft(x.to(c), n=size, dim=1)                                         # (B, 2T, d)
        af = torch.fft.fft(a, n=size, dim=0)                                               # (2T, m)
        modes = torch.fft.ifft(xf[:, :, None, :] * af[None, :, :, None], dim=1)[:, :t]     # (B, T, m, d)
        mixed = torch.einsum("kld,btld->btkd", self.weight.to(c), modes)                   # (B, T, m, d)
        return torch.einsum("k,btkd->btd", self.c.to(c), mixed).real

    @torch.no_grad()
    def naive(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 5-7 literally, per output position, in float64: the test reference."""
        b, t, d = x.shape
        n, m = self.context, self.modes
        x64 = x.double()
        padded = torch.cat([x64.new_zeros(b, n - 1, d), x64], dim=1)                       # zero history
        i = torch.arange(n, dtype=torch.float64)
        k = torch.arange(m, dtype=torch.float64)
        dft = torch.polar(torch.ones(m, n, dtype=torch.float64), -2 * math.pi * torch.outer(k, i) / n)
        w = self.weight.detach().cdouble()
        out = torch.empty(b, t, d, dtype=torch.float64)
        for s in range(t):
            window = padded[:, s:s + n].to(torch.cdouble)                                  # (B, n, d)
            xhat = torch.einsum("ki,bid->bkd", dft, window)                                # Eq. 7 DFT
            yhat = torch.einsum("kld,bld->bkd", w, xhat)                                   # Eq. 5
            z = torch.zeros(b, n, d, dtype=torch.cdouble)                                  # Eq. 6
            z[:, :m] = yhat
            for kk in range(1, m):
                z[:, n - kk] = yhat[:, kk].conj()    # conjugate symmetry of a real series
            phase = torch.polar(torch.ones(n, dtype=torch.float64),
                                2 * math.pi * torch.arange(n, dtype=torch.float64) * (n - 1) / n)
            out[:, s] = (torch.einsum("k,bkd->bd", phase.to(torch.cdouble), z) / n).real   # Eq. 7 IDFT at n-1
        return out.to(x.dtype)

    # --- recurrent ----------------------------------------------------------------------------------
    def init_state(self, batch_size: int, device: torch.device, sliding: bool = False,
                   prefix: str = "") -> dict[str, torch.Tensor]:
        """Complex state X (B, d, m); with ``sliding`` also the ring buffer of the last n inputs and a
        per-row write index (block deployment never reaches x_{t-n}, so it needs neither)."""
        state = {f"{prefix}X": torch.zeros(batch_size, self.dim, self.modes, dtype=torch.cdouble, device=device)}
        if sliding:
            state[f"{prefix}buf"] = torch.zeros(batch_size, self.context, self.dim, dtype=torch.float64, device=device)
            state[f"{prefix}t"] = torch.zeros(batch_size, dtype=torch.long, device=device)
        return state

    def step_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(V u per channel (d, m) complex128, rho (d,) float64) of the split read-out of Eq. 13. With
        X(t) = u (X(t-1) + f_t):

            y_t = Re(sum_l V_l X_l(t)) = Re(sum_l V_l u_l X_l(t-1)) + rho f_t,   rho = Re(sum_l V_l u_l)

        so the first term reads only the state before this step."""
        vu = self.readout(torch.cdouble) * self.u.unsqueeze(1)                            # (m, d)
        return vu.t(), vu.real.sum(0)

    def step_readout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, rho): the history term of ``step_weights`` as a real dot product over the state's real
        view, R = view_as_real(conj(V u)) (d, 2m), float64. Uncached (see cached_readout)."""
        vu, rho = self.step_weights()
        return torch.view_as_real(vu.conj().resolve_conj()).reshape(self.dim, 2 * self.modes), rho

    def cached_readout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """step_readout(), rebuilt whenever the weight changed (storage, version or device)."""
        key = weight_key(self._parameters["weight"])   # cheaper than self.weight on this per-step path
        if self._readout is None or self._readout_key != key:
            with torch.no_grad():
                self._readout = self.step_readout()
            self._readout_key = key
        return self._readout

    def step(self, x_t: torch.Tensor, state: dict[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
        """Eq. 13: x_t (B, d) -> y_t (B, d), O(m d); the state X (B, d, m) is updated in place."""
        X = state[f"{prefix}X"]                                       # (B, d, m) complex128
        buf = state.get(f"{prefix}buf")
        if buf is None:
            f = x_t                                                   # blocks never reach x_{t-n}
        else:
            t = state[f"{prefix}t"]
            slot = t % self.context
            rows = torch.arange(x_t.shape[0], device=x_t.device)
            f = x_t.double() - buf[rows, slot]                        # x_t - x_{t-n}
            buf[rows, slot] = x_t.double()
            t += 1
        r, rho = self.cached_readout()
        history = torch.linalg.vecdot(r, torch.view_as_real(X).flatten(-2))              # (B, d) float64
        y = torch.addcmul(history, rho, f)
        X.add_(f.unsqueeze(-1)).mul_(self.u)
        return y.to(x_t.dtype)
