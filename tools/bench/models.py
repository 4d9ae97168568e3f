"""`quadforge bench models`: CPU inference latency of one recurrent ``step`` and training throughput.

Latency follows seed 000 appendix C.4: batch 1, one thread, ``torch.inference_mode``, a warm-up of
dummy inputs, then many single steps timed one by one, reported as the median. Like the paper we time
the *last* action of a context window: before every timed step the cache's position is set to n-1,
so a Transformer attends over a full KV cache. Models are compared at matched parameter counts: for
each FCNet configuration (n, layers, hidden) the other models keep the layer count and get the hidden
width whose parameter count is closest to FCNet's. Training throughput is forward + backward +
AdamW step on random windows (windows/s, median of a few iterations). A last table times training
steps of every model at its ``cpu`` preset (and FCNet at the demo's batch) in torch's deterministic
mode (the trainers' ``seed_everything``) with and without the NaN fill of new tensors that mode does
by default, interleaved (``quadforge.seeding`` turns it off).

A full run (no --quick) also rewrites the generated part of docs/models.md, the plot
docs/latency_vs_context.png, and its own section of docs/benchmarks.md.
"""
from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from quadforge.layout import NUM_JOINTS, get_layout
from quadforge.tools.bench.common import Table, report
from quadforge.models import SequenceModel, build_model
from quadforge.models.registry import model_names
from quadforge.training.presets import preset


def bench_models() -> tuple[str, ...]:
    """Every imitation model registered now (``models.registry``), fcnet first: the others are matched to its size."""
    return model_names(trainer="imitation")


DEFAULT = dict(context=64, num_layers=4, hidden=256)
DOCS = Path(__file__).resolve().parents[2] / "docs"
START, END = "<!-- bench:models:start -->", "<!-- bench:models:end -->"


def _build(name: str, obs_dim: int, context: int, layers: int, hidden: int) -> SequenceModel:
    common = dict(obs_dim=obs_dim, action_dim=NUM_JOINTS, context=context, num_layers=layers)
    if name == "fcnet":
        return build_model(name, hidden=hidden, modes=min(10, (context + 1) // 2), **common)
    if name == "transformer":
        return build_model(name, hidden=hidden, num_heads=4, **common)
    if name == "convformer":   # the DC token layout: state + action tokens
        return build_model(name, hidden=hidden, use_actions=True, **common)
    if name == "starformer":
        return build_model(name, hidden=hidden, num_heads=4, local_dim=16, use_actions=True, **common)
    return build_model(name, hidden=hidden, **common)


def matched(name: str, target: int, obs_dim: int, context: int, layers: int) -> SequenceModel:
    """The model whose parameter count is closest to ``target`` (hidden in steps of 4)."""
    best, best_gap, hidden = None, None, 4
    while hidden <= 2048:
        model = _build(name, obs_dim, context, layers, hidden)
        gap = abs(model.num_parameters() - target)
        if best_gap is None or gap < best_gap:
            best, best_gap = model, gap
        elif model.num_parameters() > target:
            break
        hidden += 4
    return best


class _Timer:
    """Batch-1 step timing of one model at the last position of a full window."""

    def __init__(self, model: SequenceModel, warmup: int):
        self.model = model.eval()
        self.obs = torch.randn(1, model.obs_dim)
        self.cache = model.init_cache(1)
        self.samples: list[float] = []
        for _ in range(max(warmup, model.context - 1)):
            model.step(self.obs, self.cache)

    def run(self, count: int) -> None:
        n = self.model.context
        for _ in range(count):
            self.cache.pos.fill_(n - 1)
            self.cache.max_pos = n - 1
            t0 = time.perf_counter()
            self.model.step(self.obs, self.cache)
            self.samples.append(time.perf_counter() - t0)


@torch.inference_mode()
def step_latencies(models: list[SequenceModel], warmup: int, repeats: int, chunk: int = 25) -> list[float]:
    """Median seconds per step for each model. The models are timed round-robin in short chunks so
    that the load of this shared machine falls on all of them alike (ratios stay meaningful)."""
    timers = [_Timer(m, warmup) for m in models]
    for _ in range(max(1, repeats // chunk)):
        for t in timers:
            t.run(chunk)
    return [statistics.median(t.samples) for t in timers]


def train_throughput(model: SequenceModel, batch: int, iters: int) -> float:
    """Windows per second of forward + backward + AdamW step."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(batch, model.context, model.obs_dim, generator=g)
    act = torch.randn(batch, model.context, model.action_dim, generator=g)
    times = []
    for i in range(iters + 1):
        t0 = time.perf_counter()
        pred = model(obs, act if model.use_actions else None)
        loss = (pred - act).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i:   # the first iteration allocates; not timed
            times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def nan_fill_cost(models: dict[str, tuple[SequenceModel, int]], iters: int, rounds: int) -> Table:
    """Training step time of each (model, batch) in torch's deterministic mode (the trainers'
    ``seed_everything``) with and without the NaN fill of every new tensor that mode does by default,
    interleaved: why ``quadforge.seeding`` turns the fill off (the same trained bits, tests/test_seeding.py)."""
    table = Table("training step in deterministic mode, with and without its NaN fill of new tensors "
                  "(ms, median of interleaved rounds, 1 thread)",
                  ["model", "batch", "with fill ms", "without fill ms", "without / with"])
    deterministic, warn_only = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        for label, (model, batch) in models.items():
            ms: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for on in (True, False):
                    torch.utils.deterministic.fill_uninitialized_memory = on
                    ms[on].append(batch / train_throughput(model, batch, iters) * 1e3)
            with_fill, without = statistics.median(ms[True]), statistics.median(ms[False])
            table.add(label, batch, with_fill, without, without / with_fill)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    return table


def cpu_preset_models(obs_dim: int) -> dict[str, tuple[SequenceModel, int]]:
    """Every imitation model at its ``cpu`` preset (what a CPU run trains by default) with the preset's
    batch, and FCNet at the demo's batch (128)."""
    out = {}
    for name in bench_models():
        cfg = preset(name, "cpu")
        model = build_model(name, obs_dim=obs_dim, action_dim=NUM_JOINTS, context=cfg.context, **cfg.model_config)
        out[f"{name} (cpu preset)"] = (model, cfg.batch_size)
    out["fcnet (cpu preset, the demo's batch)"] = (out["fcnet (cpu preset)"][0], 128)
    return out


def main(quick: bool = False, json_path: str | None = None) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick, json_path)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, json_path: str | None) -> int:
    torch.manual_seed(0)
    names = bench_models()
    obs_dim = get_layout("proprio").dim
    warmup, repeats = (100, 200) if quick else (500, 1000)
    contexts = (16, 64, 256) if quick else (16, 64, 256, 1024)
    configs = [dict(DEFAULT, context=n) for n in contexts]
    if not quick:
        configs += [dict(DEFAULT, num_layers=l) for l in (2, 8)]
        configs += [dict(DEFAULT, hidden=h) for h in (128, 512)]

    latency = Table("step latency, batch 1, 1 thread (ms, median)",
                    ["n", "layers", "hidden", "fcnet params"] + [f"{m} ms" for m in names] + ["fcnet / transformer"])
    params = Table("matched parameter counts (hidden width chosen per model)",
                   ["n", "layers", "hidden"] + [f"{m} params (hidden)" for m in names])
    built = []
    for cfg in configs:
        n, layers, hidden = cfg["context"], cfg["num_layers"], cfg["hidden"]
        fc = _build("fcnet", obs_dim, n, layers, hidden)
        built.append([fc] + [matched(m, fc.num_parameters(), obs_dim, n, layers) for m in names[1:]])
    flat = [m for row in built for m in row]
    print(f"timing {len(flat)} models round-robin ({repeats} steps each) ...", flush=True)
    times = step_latencies(flat, warmup, repeats)
    results: list[dict[str, Any]] = []
    for i, (cfg, models) in enumerate(zip(configs, built)):
        row = {m: times[i * len(names) + j] * 1e3 for j, m in enumerate(names)}
        latency.add(cfg["context"], cfg["num_layers"], cfg["hidden"], models[0].num_parameters(),
                    *[row[m] for m in names], row["fcnet"] / row["transformer"])
        params.add(cfg["context"], cfg["num_layers"], cfg["hidden"],
                   *[f"{m.num_parameters():,} ({m.config['hidden']})" for m in models])
        results.append(dict(cfg, **{f"{m}_ms": row[m] for m in names},
                            **{f"{m}_params": mod.num_parameters() for m, mod in zip(names, models)}))

    throughput = Table("training throughput at the default size (windows/s, fwd+bwd+AdamW, 1 thread)",
                       ["n", "batch"] + list(names))
    batch, iters = (16, 2) if quick else (32, 3)
    for n in (64, 256):
        fc = _build("fcnet", obs_dim, n, DEFAULT["num_layers"], DEFAULT["hidden"])
        row = []
        for name in names:
            model = fc if name == "fcnet" else matched(name, fc.num_parameters(), obs_dim, n, DEFAULT["num_layers"])
            row.append(train_throughput(model, batch, iters))
        throughput.add(n, batch, *row)
    fill = nan_fill_cost(cpu_preset_models(obs_dim), iters=5, rounds=3 if quick else 7)

    targets = _targets(results)
    checks = Table("targets (seed 000 C.4 claims, measured in this run)", ["target", "measured", "met"])
    for t in targets:
        checks.add(t["target"], t["measured"], "yes" if t["met"] else "NO")
    tables = [latency, params, throughput, fill, checks]
    report("models", tables, json_path, extra={"quick": quick, "results": results, "targets": targets})
    if not quick:
        write_docs(tables, results)
    return 0


def _targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    default = next(r for r in results if (r["context"], r["num_layers"], r["hidden"]) == (64, 4, 256))
    by_n = sorted((r for r in results if (r["num_layers"], r["hidden"]) == (4, 256)), key=lambda r: r["context"])
    lo, hi = by_n[0], by_n[-1]
    fc_growth = hi["fcnet_ms"] / lo["fcnet_ms"]
    tf_growth = hi["transformer_ms"] / lo["transformer_ms"]
    span = f"n {lo['context']} -> {hi['context']}"
    return [
        {"target": "FCNet default step <= 0.5 ms", "measured": f"{default['fcnet_ms']:.3f} ms",
         "met": default["fcnet_ms"] <= 0.5},
        {"target": "FCNet <= 0.5 x Transformer (default)",
         "measured": f"{default['fcnet_ms'] / default['transformer_ms']:.2f} x", "met":
            default["fcnet_ms"] <= 0.5 * default["transformer_ms"]},
        {"target": f"FCNet nearly flat in n (<= 1.3x, {span})", "measured": f"{fc_growth:.2f} x",
         "met": fc_growth <= 1.3},
        {"target": f"Transformer grows with n ({span})", "measured": f"{tf_growth:.2f} x", "met": tf_growth > fc_growth},
    ]


def write_docs(tables: list[Table], results: list[dict[str, Any]]) -> None:
    body = "\n\n".join(t.markdown() for t in tables)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    block = f"{START}\n_Generated by `quadforge bench models` on {stamp}._\n\n{body}\n{END}"
    models_md = DOCS / "models.md"
    text = models_md.read_text() if models_md.exists() else "# Models\n"
    models_md.write_text(_replace_block(text, block))
    bench_md = DOCS / "benchmarks.md"
    text = bench_md.read_text() if bench_md.exists() else "# Benchmarks\n"
    section = f"## models\n\n{block}\n\nSee docs/models.md for the protocol and docs/latency_vs_context.png.\n"
    if START in text:
        bench_md.write_text(_replace_block(text, block))
    else:
        bench_md.write_text(text.rstrip("\n") + "\n\n" + section)
    _plot(results, DOCS / "latency_vs_context.png")
    print(f"wrote {models_md}, {bench_md}, {DOCS / 'latency_vs_context.png'}")


def _replace_block(text: str, block: str) -> str:
    if START in text and END in text:
        return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    return text.rstrip("\n") + "\n\n" + block + "\n"


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in results if (r["num_layers"], r["hidden"]) == (4, 256)), key=lambda r: r["context"])
    ns = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for name in bench_models():
        ax.plot(ns, [r[f"{name}_ms"] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length n")
    ax.set_ylabel("step latency, batch 1, 1 thread (ms)")
    ax.set_title("recurrent step latency vs context (matched parameters, L=4)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
