"""`quadforge bench germ`: GeRM (MoE) vs GeRM w/o MoE at matched active parameters.

Tables:
1. parameters (active / total) and batch-1 CPU latency of one control step (``GeRM.step``: push the
   observation into the context window, decode 12 dimensions greedily with the key/value cache), next to
   the same decoding recomputing the whole sequence per dimension (what the cache saves);
2. training throughput (transitions/s) of one optimizer step — forward on the online network, the two
   target-network passes of the Q objective, backward, AdamW — for germ, germ-il and germ-dense, on
   synthetic transitions in the proprio layout.
Ratios are measured in one run (the machine is shared); one torch thread throughout.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from envs.layout import PROPRIO, TERM_DIMS
from tools.bench.common import Table, median_time, report
from tools.seeding import seed_everything


def _synthetic(num_episodes: int, length: int, seed: int = 0):
    from data.episodes import EpisodeArrays
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


def latency_table(cfgs: dict, repeats: int) -> Table:
    from training.models.germ import ContextWindow, GeRM
    t = Table("GeRM step latency (batch 1, CPU, 1 thread)",
              ["model", "active params", "total params", "step ms (KV cache)", "step ms (no cache)",
               "latency vs w/o MoE"])
    rows = []
    for name, cfg in cfgs.items():
        seed_everything(0)
        model = GeRM(cfg).eval()
        window = ContextWindow(1, cfg.context, cfg.obs_dim)
        for _ in range(cfg.context):   # a full window, as in steady state
            window.push(torch.randn(1, cfg.obs_dim))
        obs = torch.randn(1, cfg.obs_dim)
        with torch.no_grad():
            cached = median_time(lambda: model.step(obs, window), repeats)
            seq, mask = window.obs.clone(), window.mask.clone()
            full = median_time(lambda: _greedy_without_cache(model, seq, mask), max(3, repeats // 4))
        rows.append((name, model.active_parameters(), model.total_parameters(), cached * 1e3, full * 1e3))
    dense_ms = next(r[3] for r in rows if r[0] == "germ-dense")
    for name, active, total, cached, full in rows:
        t.add(name, active, total, cached, full, cached / dense_ms)
    return t


def throughput_table(cfgs: dict, steps: int, batch_size: int) -> Table:
    from data.samplers import TransitionSampler
    from training.binning import fit_binner
    from training.models.germ import GeRM
    from training.qlearning import default_config, losses
    t = Table(f"GeRM training throughput (batch {batch_size}, CPU, 1 thread)",
              ["model", "objective", "transitions/s", "ms/step", "vs germ"])
    data = _synthetic(num_episodes=40, length=50)
    results = []
    for model_name, cfg in cfgs.items():
        train_cfg = default_config(model_name)
        train_cfg.model = cfg
        sampler = TransitionSampler(data, PROPRIO, cfg.context, success_ratio=None, split="all")
        binner = fit_binner(sampler.steps.actions[1:], cfg.num_bins)
        seed_everything(0)
        model = GeRM(cfg).train()
        target = copy.deepcopy(model).eval().requires_grad_(False) if train_cfg.objective == "q" else None
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        batches = [sampler.sample(batch_size) for _ in range(steps + 2)]

        def one(batch):
            terms = losses(model, target, batch, binner, train_cfg)
            opt.zero_grad(set_to_none=True)
            terms["loss"].backward()
            opt.step()

        for b in batches[:2]:
            one(b)
        t0 = time.perf_counter()
        for b in batches[2:]:
            one(b)
        dt = (time.perf_counter() - t0) / steps
        results.append((model_name, train_cfg.objective, batch_size / dt, dt * 1e3))
    base = next(r[2] for r in results if r[0] == "germ")
    for name, obj, tps, ms in results:
        t.add(name, obj, tps, ms, tps / base)
    return t


def main(quick: bool = False, json_path: str | None = None) -> int:
    from training.models.germ import GeRMConfig
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
