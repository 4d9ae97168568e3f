"""Speed-only recurrent steps of the models, beside their readable reference (the modules' ``forward``).

At batch 1 a deployment step is mostly Python: module calls, attribute look-ups and allocations would be
a third of FCNet's step (seed 000 C.4 latency). So ``step`` runs these functional versions of the layers
on precomputed *plans* (the parameter dicts a step reads, held live) with in-place ops and torch's
private in-place exact GELU (``torch._C._nn.gelu_``, the same ATen kernel as ``F.gelu``). Everything
speed-only about the step lives here; the maths is the reference's:

    fast path                                  reference
    ffn_step                                   base.FeedForward / base.Decoder
    fourier_layer_plan + fourier_step          fcnet.FourierLayer.forward at one position
    block_plan + block_step (attention_step)   transformer.Block.forward on one step's tokens

Tested against the reference: every model's ``step`` equals ``forward`` on the same window
(tests/training/test_models.py), plans follow every kind of parameter change and the GELU is exact
(tests/training/test_step_plans.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def live_params(module: nn.Module) -> dict[str, nn.Parameter]:
    """A module's own parameter dict, for the precomputed step plans. A plan keeps this dict, never the
    tensors: optimizer steps and load_state_dict copy into the parameters, and .to() and
    load_state_dict(assign=True) put the new parameter into this same dict, so a plan cannot serve a
    stale weight. One dict lookup instead of nn.Module.__getattr__ (~0.5 us, dozens per step)."""
    return module._parameters


def ffn_step(x: torch.Tensor, first: dict[str, nn.Parameter], second: dict[str, nn.Parameter]) -> torch.Tensor:
    """``FeedForward`` / ``Decoder`` (Linear -> GELU -> Linear) for one recurrent step, on live parameter
    dicts. The GELU runs in place on the first linear's fresh output: at batch 1 an allocation is a
    measurable part of an elementwise op. Same ATen kernel as ``F.gelu`` (exact erf form)."""
    hidden = F.linear(x, first["weight"], first["bias"])
    return F.linear(torch._C._nn.gelu_(hidden), second["weight"], second["bias"])


# --- FCNet ------------------------------------------------------------------------------------------------
def fourier_layer_plan(layer: nn.Module) -> tuple:
    """What one recurrent step of an ``fcnet.FourierLayer`` reads, held live."""
    n1, n2, (f1, _, f2) = layer.norm1, layer.norm2, layer.ffn
    return (n1.normalized_shape, n1.eps, live_params(n1), n2.eps, live_params(n2), live_params(f1),
            live_params(f2))


def fourier_step(x: torch.Tensor, plan: tuple, history: torch.Tensor,
                 rho: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``FourierLayer.forward`` at one position: x (B, d) -> (X^{l+1}, the CSC input f), both (B, d).
    ``history`` (B, d) is the CSC read-out of the state before this step (a fresh tensor, consumed in
    place) and rho (d,) the gain of the new input (csc.step_weights), so CSC(f)_t = history + rho f_t."""
    shape, eps1, n1, eps2, n2, f1, f2 = plan
    f = torch.layer_norm(x, shape, n1["weight"], n1["bias"], eps1)
    y = torch._C._nn.gelu_(history.addcmul_(rho, f)).add_(x)                            # Y^l
    return ffn_step(torch.layer_norm(y, shape, n2["weight"], n2["bias"], eps2), f1, f2).add_(y), f


# --- Transformer ------------------------------------------------------------------------------------------
def block_plan(block: nn.Module) -> tuple:
    """What one recurrent step of a ``transformer.Block`` reads, held live."""
    n1, n2, (f1, _, f2), attn = block.norm1, block.norm2, block.mlp, block.attn
    return (n1.normalized_shape, n1.eps, live_params(n1),
            (attn.heads, live_params(attn.qkv), live_params(attn.proj)),
            n2.eps, live_params(n2), live_params(f1), live_params(f2))


def attention_step(x: torch.Tensor, plan: tuple, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
                   slots: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``SelfAttention`` for one step's c new tokens against the KV cache. x (B, c, d); keys/values
    (B, S+1, H, dh) written in place at slots (B, c), rows (B, 1) their batch index."""
    heads, qkv, proj = plan
    b, c, d = x.shape
    q, k, v = F.linear(x, qkv["weight"], qkv["bias"]).view(b, c, 3, heads, d // heads).unbind(2)
    keys[rows, slots] = k
    values[rows, slots] = v
    y = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                       attn_mask=allowed)                            # (B, H, c, dh)
    return F.linear(y.transpose(1, 2).reshape(b, c, d), proj["weight"], proj["bias"])


def block_step(x: torch.Tensor, plan: tuple, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
               slots: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``Block.forward`` for one step's tokens x (B, c, d) against the KV cache."""
    shape, eps1, n1, attn, eps2, n2, f1, f2 = plan
    x = attention_step(torch.layer_norm(x, shape, n1["weight"], n1["bias"], eps1), attn, keys, values, rows, slots,
                       allowed).add_(x)
    return ffn_step(torch.layer_norm(x, shape, n2["weight"], n2["bias"], eps2), f1, f2).add_(x)
