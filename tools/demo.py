"""`quadforge demo`: the whole pipeline in a few minutes on a laptop-class CPU.

    quadforge demo [--out runs/demo] [--tiny] [--seed 0]

1. collect a small mixed-terrain dataset with the gait expert (``collection.collect``: labelled episodes
   in a zarr store, walking commands on flat / slope / rough-slope / stairs tiles, curriculum on);
2. train FCNet briefly on it (``training.imitation``, the ``cpu`` preset, every episode: the actions
   are the expert's whether or not the episode succeeded);
3. evaluate FCNet beside the expert over terrain types x levels (``evaluation.evaluate_expert``: the
   same sweep for both) and print the table and where the report is.

``--tiny`` shrinks every stage to seconds (the test runs it). Sizes are fields of ``DemoConfig``.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DEMO_TERRAIN = "flat,slope_up,rough_slope,stairs_up"
OPTIONS_FILE = "demo_options.json"   # written before the work: a rerun with other options is refused
DEMO_PARTS = ("store", "fcnet", "eval", "demo_summary.json", OPTIONS_FILE)
FLAGS = {"seed": "--seed", "episodes": "--episodes", "train_steps": "--train-steps"}   # the rest: --tiny or not


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    seed: int = 0
    episodes: int = 320            # collected (~8 s each at most: about 100k steps)
    num_envs: int = 16
    train_steps: int = 4000
    batch_size: int = 128
    eval_terrain: str = "flat,slope_up,rough_slope"
    eval_levels: str = "0-1"
    eval_episodes: int = 8         # per terrain type x level, per policy
    max_episode_s: float = 8.0

    @classmethod
    def tiny(cls, out: str, seed: int = 0) -> "DemoConfig":
        return cls(out=out, seed=seed, episodes=6, num_envs=3, train_steps=4, batch_size=8, eval_terrain="flat",
                   eval_levels="0", eval_episodes=1, max_episode_s=1.0)

    def validate(self) -> "DemoConfig":
        for name in ("episodes", "num_envs", "train_steps", "batch_size", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"demo {name}={getattr(self, name)!r}; must be an integer >= 1")
        from quadforge.output_paths import check_output_dir
        # a demo folder (store/, checkpoints, eval/) re-runs in place; anything else is refused before work
        out = check_output_dir(self.out, "demo run", owns=lambda p: any((p / n).exists() for n in DEMO_PARTS))
        if out.is_dir() and any(out.iterdir()):
            self._check_rerun(out)
        return self

    def options(self) -> dict:
        """What the results depend on (``out`` is where they go, however it is spelled)."""
        return {k: v for k, v in asdict(self).items() if k != "out"}

    def _check_rerun(self, out: Path) -> None:
        """A rerun reuses the store (collection tops it up to ``episodes``) and replaces fcnet/ and eval/:
        right for the same options, but with others the "seed 5" model would be trained on seed-0 data."""
        earlier = _recorded_options(out)
        if not isinstance(earlier, dict):
            raise ValueError(f"--out {out}: holds a demo whose options were not recorded (an interrupted run); "
                             f"give a new --out, or remove this one to start over")
        differ = [k for k, v in self.options().items() if earlier.get(k) != v]
        if differ:
            said = ", ".join(f"{FLAGS.get(k, k)} {getattr(self, k)} (earlier {earlier.get(k)})" for k in differ)
            tiny = " (--tiny sizes)" if any(k not in FLAGS for k in differ) else ""
            raise ValueError(f"--out {out}: holds an earlier demo run with other options: {said}{tiny}; its store "
                             f"and model would be reused or replaced: give a new --out, or rerun with the same options")


def _recorded_options(out: Path) -> dict | None:
    """The options the demo in ``out`` ran with: its options file, else (older demos) its summary's config."""
    for name, key in ((OPTIONS_FILE, None), ("demo_summary.json", "config")):
        try:
            recorded = json.loads((out / name).read_text())
            return recorded if key is None else recorded[key]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return None


def run_demo(cfg: DemoConfig, log=print) -> dict:
    import torch

    from quadforge.collection.collect import CollectConfig, run_local
    from quadforge.evaluation.evaluate import EvalConfig
    from quadforge.evaluation.evaluate_expert import expert_report
    from quadforge.training.imitation import train
    from quadforge.training.optim import OptimConfig
    from quadforge.training.presets import preset

    cfg.validate()
    torch.set_num_threads(1)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / OPTIONS_FILE).write_text(json.dumps(cfg.options(), indent=1))
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    store = out / "store"
    log(f"[1/3] collecting {cfg.episodes} episodes with the gait expert on {DEMO_TERRAIN} -> {store}")
    collected = run_local(CollectConfig(out=str(store), episodes=cfg.episodes, policy="gait", terrain=DEMO_TERRAIN,
                                        skills="walking", num_envs=cfg.num_envs, seed=cfg.seed,
                                        max_episode_s=cfg.max_episode_s, compact_every=0, progress=True))
    times["collect_s"] = time.perf_counter() - t0
    run = collected.get("run", {})
    log(f"      {collected['in_store']} episodes in the store, {run.get('env_steps', 0)} env-steps this run, "
        f"success ratio {run.get('success_ratio', float('nan')):.2f}, {times['collect_s']:.0f}s")

    t0 = time.perf_counter()
    tcfg = preset("fcnet", "cpu")
    # The demo keeps the optimizer its README number was measured with (seed 000's AdamW form at lr 2e-3):
    # the equal-budget sweep picked the cpu preset's AdamW 3e-3 by validation loss after 500 steps, and
    # on this closed-loop demo that gave 54 % (26/48) against 62.5-73 % (docs/models.md, the ladder:
    # offline loss is not how to pick imitation policies).
    tcfg.optim = OptimConfig(name="adamw", lr=2e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4,
                             warmup_frac=0.2, grad_clip=1.0)
    tcfg.seed, tcfg.max_steps, tcfg.batch_size = cfg.seed, cfg.train_steps, cfg.batch_size
    tcfg.val_every = tcfg.log_every = max(1, cfg.train_steps // 3)
    tcfg.tensorboard = False
    log(f"[2/3] training FCNet ({cfg.train_steps} steps, batch {cfg.batch_size}, context {tcfg.context}) "
        f"-> {out / 'fcnet'}")
    trained = train(tcfg, str(store), out / "fcnet", overwrite=True)   # the demo's own folder (checked above)
    times["train_s"] = time.perf_counter() - t0
    if trained.checkpoint is None:
        raise RuntimeError("FCNet training wrote no checkpoint")
    log(f"      {times['train_s']:.0f}s, checkpoint {trained.checkpoint}")

    t0 = time.perf_counter()
    ecfg = EvalConfig(out=str(out / "eval"), terrain=cfg.eval_terrain, levels=cfg.eval_levels,
                      episodes=cfg.eval_episodes, commands=["walking"], num_envs=cfg.num_envs, seed=cfg.seed,
                      max_episode_s=cfg.max_episode_s)
    log(f"[3/3] evaluating the gait expert and FCNet on {cfg.eval_terrain}, levels {cfg.eval_levels}, "
        f"{cfg.eval_episodes} episodes per cell")
    labels = ["gait expert", "FCNet"]
    report = expert_report(ecfg, ["gait", str(trained.checkpoint)], labels=labels,
                           title="Demo: the gait expert and FCNet trained on its data")
    times["eval_s"] = time.perf_counter() - t0

    from quadforge.evaluation.reports import overall_table
    print()
    print(overall_table(report["results"], labels))
    print()
    summary = {"config": asdict(cfg), "collected": collected, "checkpoint": str(trained.checkpoint),
               "report": str(report["report"]), "seconds": times,
               "overall": {lab: r["overall"] for lab, r in zip(labels, report["results"])}}
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    log(f"report: {report['report']}  (collect {times['collect_s']:.0f}s, train {times['train_s']:.0f}s, "
        f"eval {times['eval_s']:.0f}s)")
    return summary


from quadforge.cli_flags import add_out, add_seed  # noqa: E402  (the CLI layer: beside its flags)

def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    add_out(p, "store, checkpoint, report", d.out)
    add_seed(p, d.seed)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run of every stage")
    p.add_argument("--episodes", type=int, default=None, help=f"episodes to collect (default {d.episodes})")
    p.add_argument("--train-steps", type=int, default=None, help=f"FCNet optimizer steps (default {d.train_steps})")


def run(args: argparse.Namespace) -> int:
    cfg = DemoConfig.tiny(args.out, args.seed) if args.tiny else DemoConfig(out=args.out, seed=args.seed)
    if args.episodes is not None:
        cfg.episodes = args.episodes
    if args.train_steps is not None:
        cfg.train_steps = args.train_steps
    run_demo(cfg)
    return 0
