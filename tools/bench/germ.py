"""`quadforge bench germ`: GeRM (MoE) vs GeRM w/o MoE at matched active parameters.

Tables:
1. parameters (active / total) and batch-1 CPU latency of one control step (``GeRM.step``: push the
   observation into the context window, decode 12 dimensions greedily with the key/value cache), next to
   the same decoding recomputing the whole sequence per dimension (what the cache saves);
2. training throughput (transitions/s) of one optimizer step — forward on the online network, the two
   target-network passes of the Q objective, backward, AdamW — for germ, germ-il and germ-dense, on
   synthetic transitions in the proprio layout.
Ratios are measured in one run with the candidates timed round-robin, so load drift on the shared
machine hits them alike; medians; one torch thread throughout.
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Callable

import numpy as np
import torch

from quadforge.layout import PROPRIO, TERM_DIMS
from quadforge.tools.bench.common import Table, report
from quadforge.seeding import seed_everything


def _synthetic(num_episodes: int, length: int, seed: int = 0):
    from quadforge.data.episodes import EpisodeArrays
    rng = np.random.default_rng(seed)
    steps = num_episodes * length
    feats = {n: rng.normal(size=(steps, TERM_DIMS[n])).astype(np.float32) for n in PROPRIO.term_names}
    feats["actions"] = np.tanh(rng.normal(size=(steps, 12))).astype(np.float32)
    success = rng.random(num_episodes) < 0.7
    term = np.zeros(steps, np.float32)
    term[np.arange(1, num_episodes + 1) * length - 1] = ~success
    feats["terminated"] = term
    return EpisodeArrays(feats, np.arange(1, num_episodes + 1) * length, {"success": success})


def _greedy_without_cache(model, obs, mask):
    """Reference decoding: one full forward per dimension (no key/value cache)."""
    bins = torch.zeros(obs.shape[0], 0, dtype=torch.long)
    for _ in range(model.cfg.action_dim):
        logits = model(obs, mask, bins).logits[:, -1]
        bins = torch.cat([bins, logits.argmax(-1, keepdim=True)], dim=1)
    return bins


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each fn, timed in round-robin so load drift on a shared machine hits
    every candidate alike (the ratios are what this benchmark reports)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}


def latency_table(cfgs: dict, repeats: int) -> Table:
    from quadforge.models.germ import ContextWindow, GeRM
    t = Table("GeRM step latency (batch 1, CPU, 1 thread)",
              ["model", "active params", "total params", "step ms (KV cache)", "step ms (no cache)",
               "latency vs w/o MoE"])
    models, fns = {}, {}
    for name, cfg in cfgs.items():
        seed_everything(0)
        model = GeRM(cfg).eval()
        window = ContextWindow(1, cfg.context, cfg.obs_dim)
        for _ in range(cfg.context):   # a full window, as in steady state
            window.push(torch.randn(1, cfg.obs_dim))
        obs = torch.randn(1, cfg.obs_dim)
        seq, mask = window.obs.clone(), window.mask.clone()
        models[name] = model
        fns[f"{name}/cached"] = lambda m=model, w=window, o=obs: m.step(o, w)
        fns[f"{name}/full"] = lambda m=model, s_=seq, k=mask: _greedy_without_cache(m, s_, k)
    with torch.no_grad():
        med = interleaved_medians(fns, repeats)
    dense_ms = med["germ-dense/cached"]
    for name, model in models.items():
        t.add(name, model.active_parameters(), model.total_parameters(), med[f"{name}/cached"] * 1e3,
              med[f"{name}/full"] * 1e3, med[f"{name}/cached"] / dense_ms)
    return t


def throughput_table(cfgs: dict, steps: int, batch_size: int) -> Table:
    from quadforge.data.samplers import TransitionSampler
    from quadforge.models.binning import fit_binner
    from quadforge.models.germ import GeRM
    from quadforge.training.qlearning import default_config, losses
    t = Table(f"GeRM training throughput (batch {batch_size}, CPU, 1 thread)",
              ["model", "objective", "transitions/s", "ms/step", "vs germ"])
    data = _synthetic(num_episodes=40, length=50)
    fns, objectives = {}, {}
    for model_name, cfg in cfgs.items():
        train_cfg = default_config(model_name)
        train_cfg.model = cfg
        sampler = TransitionSampler(data, PROPRIO, cfg.context, success_ratio=None, split="all")
        binner = fit_binner(sampler.binning_actions(), cfg.num_bins)
        seed_everything(0)
        model = GeRM(cfg).train()
        target = copy.deepcopy(model).eval().requires_grad_(False) if train_cfg.objective == "q" else None
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        batch = sampler.sample(batch_size)

        def one(model=model, target=target, batch=batch, binner=binner, train_cfg=train_cfg, opt=opt):
            terms = losses(model, target, batch, binner, train_cfg)
            opt.zero_grad(set_to_none=True)
            terms["loss"].backward()
            opt.step()

        fns[model_name], objectives[model_name] = one, train_cfg.objective
    med = interleaved_medians(fns, steps)
    base = med["germ"]
    for name, dt in med.items():
        t.add(name, objectives[name], batch_size / dt, dt * 1e3, base / dt)
    return t


def main(quick: bool = False, json_path: str | None = None) -> int:
    from quadforge.models.germ import GeRMConfig
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        moe = GeRMConfig(obs_dim=PROPRIO.dim, action_dim=12, num_bins=256, context=8, d_model=128,
                         num_layers=4, num_heads=4, ffn_hidden=256, num_experts=8, top_k=2)
        cfgs = {"germ": moe, "germ-dense": moe.dense_matched()}
        lat = latency_table(cfgs, repeats=20 if quick else 100)
        thr = throughput_table({"germ": moe, "germ-il": moe, "germ-dense": moe.dense_matched()},
                               steps=5 if quick else 30, batch_size=64)
        extra = {"config": {"moe": moe.to_dict(), "dense": moe.dense_matched().to_dict()}, "quick": quick}
        report("germ", [lat, thr], json_path, extra)
    finally:
        torch.set_num_threads(threads)
    return 0
