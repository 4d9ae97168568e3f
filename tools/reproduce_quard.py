"""`quadforge reproduce --stages quard`: the QUARD-Auto loop and seed 003's Table III on our tasks.

    quadforge reproduce --stages quard [--scale tiny|cpu|paper|power] [--train-steps N] [--rounds K] [--seeds 0,1,2]
                        [--demos STORE] [--pretrained CKPT] [--fig6 FAMILY] [--jobs N]
                        [--out runs/reproduce_quard] [--docs docs/results.md] [--report-only | --status]

The loop is a fixed sequence of ordinary ``quadforge`` commands (the plan, ``build_plan``), each run as its
own process so the report can quote the exact command line:

1. ``demos``     the privileged expert collects demonstrations (``collect --task quard:all --policy quard_expert``);
                 skipped with ``--demos STORE`` (an existing demonstration store).
2. ``pretrain``  GeRM w/o MoE learns from the demonstrations alone (seed 003 §IV-A: the pre-trained VLA);
                 skipped with ``--pretrained CKPT`` (an existing VLA checkpoint collects round 0).
3. ``auto``      round k's training store starts as a copy of the demonstrations (``cp -r``, done in this
                 process), then round k's collector (round 0: the pre-trained VLA; round k: round k-1's GeRM)
                 drives the gait controller and adds its successes and failures.
4. ``train``     Table III's models on that store with the same steps and batch: RT-1-style, GeRM w/o RL,
                 GeRM w/o MoE and GeRM, the last two with (Y) and without (N, ``--success-only``) the
                 failures. Later rounds train GeRM (Y) only: it is the next round's collector.
5. ``eval``      every trained model on every family (one ``eval --task quard:all`` per model: success per
                 family and colour set) over the seeds.
6. ``fig6_*``    with ``--fig6 FAMILY``: seed 003's Fig. 6, the four models on that family's demonstrations
                 alone, every kept checkpoint evaluated on the family (success against epochs).

Every step names the steps whose outputs it reads (``Step.after``); ``--jobs N`` runs up to N steps at once,
each as soon as those are done.

A step is complete when its output is (a store holding its target episode count; a training directory with
``last.pt`` and the step's record of the same ``--max-steps``; an ``eval.json`` begun after the last run of
the training it scores), and is then skipped: an
interrupted run resumes where it stopped, and a longer ``--train-steps`` continues finished trainings and
scores them again (``steps_to_run``). Every finished step writes ``OUT/steps/<id>.json`` (command, wall time) and every evaluation
``OUT/results/<run>.json`` (successes, episodes, parameters); the report (``tools/quard_report.py``) is
built from those files alone. A step whose command does not exist in this build fails before running with
a message naming the missing capability: nothing is faked.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from quadforge.envs.backends import BACKENDS
from quadforge.envs.quard.families import family_names
from quadforge.output_paths import holds_run
from quadforge.tools.parent_watch import PARENT_ENV
from quadforge.tools.quard_report import MODEL_NAMES, TABLE3_ROWS, update_docs
from quadforge.tools.train_progress import TrainingProgress, batch_size_of, training_progress

# the colour sets every evaluation covers (envs.quard.env.COLOUR_SETS): the seen colours and the held-out ones
EVAL_COLOURS = ("train", "held_out")


@dataclass(frozen=True)
class QuardScale:
    """The sizes of one scale. Episode counts are per collection; eval episodes per family per seed."""
    name: str
    demo_episodes: int
    auto_episodes: int
    train_steps: int | None      # None: the preset's own length (paper)
    batch_size: int | None
    preset: str                  # training preset of the VLA models (training/vla.py): cpu | paper
    eval_episodes: int | None    # per family and colour set and seed; None: from the power analysis (row_power)
    num_envs: int
    note: str
    # success rates (p1, p2) the evaluation must tell apart with 80 % power at a two-sided α of 0.05, over all
    # families pooled (evaluation.metrics.episodes_for_power); used when eval_episodes is None
    row_power: tuple[float, float] | None = None
    val_every: int | None = None  # validation (and its loss curve point) every N training steps; None: the preset's
    keep_every: int | None = None  # also keep step_N.pt every N steps; None: last.pt only
    # Fig. 6 (--fig6 FAMILY): each model trains on that family's demonstrations alone for fig6_steps, keeping
    # step_N.pt every fig6_every steps, each evaluated on fig6_episodes episodes of the family (seen colours)
    fig6_steps: int = 2000
    fig6_every: int = 200
    fig6_episodes: int = 16

    def row_episodes(self) -> int | None:
        """Evaluation episodes a Table III row needs, over seeds, families and colour sets together."""
        if self.row_power is None:
            return None
        from quadforge.evaluation.metrics import episodes_for_power
        return episodes_for_power(*self.row_power)

    def eval_per_cell(self, seeds: int) -> int:
        """Episodes per family, colour set and seed: the scale's own, or the power analysis's row count
        spread over the cells (rounded up, so every row gets at least that many)."""
        if self.eval_episodes is not None:
            return self.eval_episodes
        cells = len(family_names()) * len(EVAL_COLOURS) * seeds
        return math.ceil(self.row_episodes() / cells)


def _at_most(every: int | None, steps: int, count: int) -> int | None:
    """An every-N-steps interval widened so that ``steps`` steps hold at most about ``count`` of them."""
    return None if every is None else max(every, math.ceil(steps / count))


SCALE_PRESETS: dict[str, QuardScale] = {
    # a smoke test of the plumbing: minutes, numbers meaningless
    "tiny": QuardScale("tiny", demo_episodes=8, auto_episodes=8, train_steps=4, batch_size=4, preset="cpu",
                       eval_episodes=1, num_envs=2, note="plumbing only (tens of minutes); the numbers mean nothing",
                       fig6_steps=4, fig6_every=2, fig6_episodes=1),
    # the documented run on this machine, sized from per-step costs measured at tiny scale (docs/quard_auto.md,
    # "Scales and what each costs"): training the 18 Table III runs dominates, so steps are what was cut
    "cpu": QuardScale("cpu", demo_episodes=200, auto_episodes=200, train_steps=300, batch_size=16, preset="cpu",
                      eval_episodes=3, num_envs=8, note="about 3 h as the machine's main job on 2 cores "
                      "(estimate from measured per-step costs; ~7 h niced beside other work)"),
    # seed 003's sizes: 8610 demonstrations; QUARD-Auto failed 53.5 % of the time (138290 / 258418), so
    # 5200 auto-collected episodes give about the 2766 failures Table III trained on; a GPU cluster's run
    "paper": QuardScale("paper", demo_episodes=8610, auto_episodes=5200, train_steps=None, batch_size=None,
                        preset="paper", eval_episodes=100, num_envs=64,
                        note="seed 003's data sizes and the paper preset: a GPU cluster, not this machine"),
    # issue 25's rerun: evaluation sized by the power analysis (15 points at 80 % power over all families,
    # docs/results.md), training long enough for the validation losses to flatten (the report shows the curves
    # and says which did), a collector that follows instructions (--pretrained experts/checkpoints/vla_rt1.pt)
    "power": QuardScale("power", demo_episodes=400, auto_episodes=400, train_steps=2000, batch_size=16,
                        preset="cpu", eval_episodes=None, num_envs=9, row_power=(0.50, 0.65), val_every=200,
                        keep_every=500, note="Table III sized by its power analysis; measured on 2 CPU cores with "
                        "--seeds 0 --jobs 2: round 0 in about 1.4 h, 2.3 h with --fig6 and --rounds 3"),
}
SCALES = tuple(SCALE_PRESETS)


@dataclass
class QuardConfig:
    out: str = "runs/reproduce_quard"
    docs: str = "docs/results.md"
    scale: str = "cpu"
    seeds: tuple[int, ...] = (0, 1, 2)
    rounds: int = 1                  # collection rounds (the data flywheel); 1: Table III alone
    pretrain_model: str = "germ-dense"   # seed 003: GeRM w/o MoE pre-trained on demonstrations
    task: str = "quard:all"
    seed: int = 0                    # root seed of the collections
    demos: str | None = None         # an existing demonstration store instead of the demos step (--demos)
    pretrained: str | None = None    # a VLA checkpoint as round 0's collector instead of pretrain (--pretrained)
    fig6: str | None = None          # a QUARD family: seed 003's Fig. 6 (success against epochs) on it (--fig6)
    # key=value training options given to every training step (--train-override), e.g. early_share=0.5
    train_overrides: tuple[str, ...] = ()
    # MODEL=CKPT: every training of that model starts from the checkpoint's weights (--init; init_from),
    # e.g. rt1=experts/checkpoints/vla_rt1.pt: rows that start grounded (docs/results.md)
    init: tuple[str, ...] = ()
    # where the steps run: the trainings' torch device (--device) and the collections' and evaluations'
    # physics (--backend, --warp-device): the whole loop on a GPU is --device cuda --backend mujoco_warp
    device: str = "cpu"
    backend: str = "mujoco_cpu"
    warp_device: str | None = None
    # optimizer steps of every Table III and flywheel training instead of the scale's (--train-steps; the
    # pre-trained collector and Fig. 6 keep the scale's); over a finished run, a longer budget continues
    # each training from its last.pt (is_complete) and scores it again
    train_steps: int | None = None

    @property
    def sizes(self) -> QuardScale:
        scale = SCALE_PRESETS[self.scale]
        if self.train_steps is None:
            return scale
        n = int(self.train_steps)
        # at most ~40 validation points and ~4 kept checkpoints however long: a 24,000-step GeRM run that
        # kept step_N.pt every 500 steps would hold 48 checkpoints of ~90 MB each
        return replace(scale, train_steps=n, val_every=_at_most(scale.val_every, n, 40),
                       keep_every=_at_most(scale.keep_every, n, 4))

    def validate(self) -> "QuardConfig":
        if self.scale not in SCALE_PRESETS:
            raise ValueError(f"--scale={self.scale!r}; allowed: {', '.join(SCALES)}")
        if len(self.seeds) < 1:
            raise ValueError("--seeds is empty; give e.g. 0,1,2 (Table III wants >= 3)")
        if not 1 <= int(self.rounds) <= 10:
            raise ValueError(f"--rounds={self.rounds}; give 1..10 collection rounds")
        if self.train_steps is not None and int(self.train_steps) < 1:
            raise ValueError(f"--train-steps {self.train_steps}: give the optimizer steps of every training, >= 1")
        if self.pretrain_model not in MODEL_NAMES:
            raise ValueError(f"--pretrain-model={self.pretrain_model!r}; allowed: {', '.join(MODEL_NAMES)}")
        if self.demos is not None:
            n = store_episodes(self.demos)
            if n == 0:
                raise ValueError(f"--demos {self.demos}: no trajectory store with episodes there; give the store a "
                                 f"`quadforge collect --task quard:all --policy quard_expert` run wrote")
            from quadforge.data.store import TrajectoryStore
            feats = TrajectoryStore.open(self.demos).image_features
            if "images/front_rgb" not in feats:
                raise ValueError(f"--demos {self.demos}: the store has no camera frames (images/front_rgb); the VLAs "
                                 f"train on them: collect it with --task quard:...")
        if self.pretrained is not None:
            self.pretrained = str(pretrained_checkpoint(self.pretrained))
        check_train_overrides(self.train_overrides)
        self.inits()
        if self.fig6 is not None and self.fig6 not in family_names():
            raise ValueError(f"--fig6 {self.fig6!r}: not a QUARD family; allowed: {', '.join(family_names())}")
        from quadforge.output_paths import check_output_dir, check_output_file, is_text_file
        # a rerun resumes the run its run.json (written first) or its step records describe; anything else
        # in a non-empty folder is not ours
        check_output_dir(self.out, "QUARD reproduction run",
                         owns=lambda p: (p / "run.json").is_file() or (p / "steps").is_dir())
        check_output_file(self.docs, flag="--docs", owns=is_text_file)
        self._check_devices()
        return self

    def inits(self) -> dict[str, str]:
        """``--init`` as {model: checkpoint path}, each checked (a Table III model, once, a VLA checkpoint
        of that model)."""
        out: dict[str, str] = {}
        for item in self.init:
            model, sep, path = item.partition("=")
            if not sep or model not in MODEL_NAMES or not path:
                raise ValueError(f"--init {item!r}: give MODEL=CKPT with MODEL one of {', '.join(MODEL_NAMES)}")
            if model in out:
                raise ValueError(f"--init: {model} given twice")
            out[model] = str(pretrained_checkpoint(path, "--init", model))
        return out

    def _check_devices(self) -> None:
        """Before any step runs: a CUDA device and MuJoCo Warp where the options ask for them."""
        from quadforge.envs.backends import backend_spec
        from quadforge.training.distributed import resolve_device
        backend_spec(self.backend)                   # ValueError naming the registered backends
        resolve_device(self.device)                  # the trainers' own check: a known kind, CUDA present
        if self.backend == "mujoco_warp":
            from quadforge.envs.backends.mujoco_warp import available
            if not available():
                raise ValueError("--backend mujoco_warp: mujoco-warp and warp-lang are not installed "
                                 "(pip install 'quadforge[gpu]')")
        elif self.warp_device is not None:
            raise ValueError(f"--warp-device {self.warp_device}: only with --backend mujoco_warp")


def check_train_overrides(items: tuple[str, ...]) -> None:
    """Every ``--train-override`` is a ``key=value`` every Table III model's training config takes (checked on
    each model's default config, and ``model.*`` values on the model config they build, so a typo or a bad
    value fails before any step runs, not after the demonstrations are collected)."""
    from quadforge.overrides import apply_overrides, parse_overrides
    from quadforge.training.vla import default_config, model_config
    try:
        parsed = parse_overrides(list(items))
        for model in MODEL_NAMES:
            cfg = apply_overrides(default_config(model, "cpu"), dict(parsed))
            model_config(cfg, (64, 64), ["go to the red cube"])
    except ValueError as err:
        raise ValueError(f"--train-override: {err}") from err


def pretrained_checkpoint(path: str, flag: str = "--pretrained", model: str | None = None) -> Path:
    """A VLA checkpoint file (or a training directory holding ``last.pt``), checked to be one (of ``model``
    when given); errors name ``flag``."""
    p = Path(path)
    if p.is_dir():
        p = p / "last.pt"
    if not p.is_file():
        raise FileNotFoundError(f"{flag} {path}: no checkpoint there (a .pt file or a training directory "
                                f"with last.pt)")
    from quadforge.models.checkpoint import load_checkpoint
    from quadforge.training.grounding import upcycle_sources
    try:
        ckpt = load_checkpoint(str(p))
    except ValueError as err:
        raise ValueError(f"{flag} {path}: {err}") from err
    kind = (ckpt.extra or {}).get("policy_kind")
    if kind != "vla":
        raise ValueError(f"{flag} {path}: not a vision-language-action checkpoint (policy kind {kind!r}); "
                         f"give one `quadforge train --model germ-dense|germ|rt1|germ-il` wrote on an image store")
    sources = upcycle_sources(model) if model is not None else ()
    if model is not None and ckpt.model_name != model and ckpt.model_name not in sources:
        raise ValueError(f"{flag} {path}: holds a {ckpt.model_name!r} model, not {model!r}"
                         + (f" (a {' / '.join(sources)} checkpoint can start it: upcycling)" if sources else ""))
    return p


# --- the plan --------------------------------------------------------------------------------------------
@dataclass
class Step:
    id: str
    stage: str                  # demos | pretrain | auto | train | eval
    argv: list[str]             # after `quadforge`
    output: str                 # the path whose completeness marks the step done
    needs: tuple[str, ...]      # capabilities (CAPABILITIES) the command needs
    meta: dict[str, Any] = field(default_factory=dict)
    program: str = "quadforge"  # or "copy": argv = [source store, destination store], done in this process
    after: tuple[str, ...] = ()  # ids of the steps whose outputs this one reads (--jobs runs the others beside it)

    @property
    def command(self) -> str:
        if self.program == "copy":
            return "cp -r " + " ".join(shlex.quote(a) for a in self.argv)
        return "quadforge " + " ".join(shlex.quote(a) for a in self.argv)


def run_name(model: str, failures: bool, rnd: int, seed: int) -> str:
    return f"{model}_{'Y' if failures else 'N'}_r{rnd}_s{seed}"


def _train_argv(cfg: QuardConfig, model: str, failures: bool, store: str, out: str, seed: int,
                sizes: QuardScale | None = None) -> list[str]:
    s = sizes or cfg.sizes
    argv = ["train", "--model", model, "--store", store, "--out", out, "--seed", str(seed), "--preset", s.preset]
    if s.train_steps is not None:
        argv += ["--max-steps", str(s.train_steps)]
    if s.batch_size is not None:
        argv += ["--batch-size", str(s.batch_size)]
    if not failures:
        argv.append("--success-only")
    argv += [f"{k}={v}" for k, v in (("val_every", s.val_every), ("keep_every", s.keep_every)) if v is not None]
    return argv + _device_argv(cfg) + list(cfg.train_overrides) + _init_argv(cfg, model)


def _init_argv(cfg: QuardConfig, model: str) -> list[str]:
    """``init_from=CKPT`` for a model ``--init`` names (the path as given: the plan stays pure)."""
    given = dict(item.partition("=")[::2] for item in cfg.init)
    return [f"init_from={given[model]}"] if model in given else []


def _collect_argv(cfg: QuardConfig, policy: str, store: str, episodes: int, collector: str, seed: int) -> list[str]:
    return ["collect", "--task", cfg.task, "--policy", policy, "--store", store, "--episodes", str(episodes),
            "--collector-id", collector, "--num-envs", str(cfg.sizes.num_envs), "--seed", str(seed), "--no-progress",
            *_physics_argv(cfg)]


def _physics_argv(cfg: QuardConfig) -> list[str]:
    """A collection's or evaluation's physics flags; none for the default (plans read as before)."""
    if cfg.backend == "mujoco_cpu":
        return []
    return ["--backend", cfg.backend, *(["--warp-device", cfg.warp_device] if cfg.warp_device else [])]


def _device_argv(cfg: QuardConfig) -> list[str]:
    """A training's ``--device``; none for the CPU default."""
    return [] if cfg.device == "cpu" else ["--device", cfg.device]


def balanced_envs(episodes: int, most: int) -> int:
    """Envs for ``episodes`` per cell, at most ``most``, so that every env runs the same number of episodes
    (``Rollout.first_episodes`` gives each env its quota; 16 episodes on up to 9 envs: 8 envs x 2, not 9
    envs of which 7 run a second episode). Envs do not run in waves - each starts its next episode when
    its last ends - but with equal quotas none waits on the others' extra episodes."""
    waves = math.ceil(episodes / most)
    return math.ceil(episodes / waves)


def build_plan(cfg: QuardConfig) -> list[Step]:
    """Every step of the loop in order, as `quadforge` command lines (paths relative to ``cfg.out``'s parent
    as given), each naming the steps whose outputs it reads (``after``). Pure: the same config gives the same
    plan (docs/quard_auto.md prints it per scale)."""
    s, out = cfg.sizes, cfg.out.rstrip("/")
    per_cell = s.eval_per_cell(len(cfg.seeds))
    steps: list[Step] = []
    first: tuple[str, ...] = ()
    if cfg.demos is None:
        demos, n_demos = f"{out}/data/demos", s.demo_episodes
        steps.append(Step("demos", "demos", _collect_argv(cfg, "quard_expert", demos, n_demos, "expert", cfg.seed),
                          demos, ("quard_collect", "quard_expert"), {"episodes": n_demos}))
        first = ("demos",)
    else:   # --demos: a store someone already collected (read now: the round stores start from all of it)
        demos, n_demos = cfg.demos.rstrip("/"), store_episodes(cfg.demos)
    if cfg.pretrained is None:
        pre = f"{out}/train/pretrain_{cfg.pretrain_model}"
        # the scale's own length: --train-steps lengthens the rows, not round 0's collector (its data)
        argv = _train_argv(cfg, cfg.pretrain_model, False, demos, pre, cfg.seed, SCALE_PRESETS[cfg.scale])
        steps.append(Step("pretrain", "pretrain", argv, pre, ("vla_train",), {"model": cfg.pretrain_model},
                          after=first))
        collector, collector_step = f"{pre}/last.pt", ("pretrain",)
    else:   # --pretrained: a shipped VLA checkpoint collects round 0
        collector, collector_step = cfg.pretrained, ()
    for rnd in range(cfg.rounds):
        store = f"{out}/data/round{rnd}"
        # the round's store starts as a copy of the demonstrations (collecting them again would cost as much
        # as the first time for the same episodes), then the round's collector tops it up
        steps.append(Step(f"r{rnd}-demos", "auto", [demos, store], store, (),
                          {"round": rnd, "episodes": n_demos, "collector": "demos"}, program="copy", after=first))
        steps.append(Step(f"r{rnd}-auto", "auto",
                          _collect_argv(cfg, collector, store, n_demos + s.auto_episodes, f"auto{rnd}",
                                        cfg.seed + 1 + rnd),
                          store, ("quard_collect", "vla_policy"),
                          {"round": rnd, "episodes": n_demos + s.auto_episodes, "collector": f"auto{rnd}",
                           "policy": collector}, after=(f"r{rnd}-demos", *collector_step)))
        rows = TABLE3_ROWS if rnd == 0 else (("germ", True),)
        for model, failures in rows:
            for seed in cfg.seeds:
                name = run_name(model, failures, rnd, seed)
                tdir = f"{out}/train/{name}"
                meta = {"model": model, "failures": failures, "round": rnd, "seed": seed, "run": name}
                steps.append(Step(f"train-{name}", "train", _train_argv(cfg, model, failures, store, tdir, seed),
                                  tdir, ("vla_train",), meta, after=(f"r{rnd}-auto",)))
                # one process evaluates every family (and colour set) in turn: the start-up (torch, the
                # checkpoint) is paid once per model, not per family; no more envs than episodes per cell,
                # or the surplus envs would run episodes nobody keeps
                edir = f"{out}/eval/{name}"
                steps.append(Step(f"eval-{name}", "eval",
                                  ["eval", "--task", "quard:all", "--policy", f"{tdir}/last.pt", "--out", edir,
                                   "--colours", ",".join(EVAL_COLOURS), "--episodes-per-cell", str(per_cell),
                                   "--num-envs", str(balanced_envs(per_cell, s.num_envs)), "--seed", str(1000 + seed),
                                   *_physics_argv(cfg)],
                                  edir, ("quard_eval", "vla_policy"), meta, after=(f"train-{name}",)))
        collector_name = run_name("germ", True, rnd, cfg.seeds[0])
        collector, collector_step = f"{out}/train/{collector_name}/last.pt", (f"train-{collector_name}",)
    if cfg.fig6 is not None:
        steps += fig6_steps(cfg, demos, first)
    return steps


# seed 003 Fig. 6: RT-1, GeRM w/o RL, GeRM w/o MoE and GeRM on "go to the red cube", demonstrations only
FIG6_MODELS = ("rt1", "germ-il", "germ-dense", "germ")


def fig6_steps(cfg: QuardConfig, demos: str, after: tuple[str, ...]) -> list[Step]:
    """Fig. 6's steps: each model trained on one family's demonstrations (``--success-only``, the family
    alone), its checkpoint every ``fig6_every`` steps evaluated on that family (seen colours)."""
    s, out, fam, seed = cfg.sizes, cfg.out.rstrip("/"), cfg.fig6, cfg.seeds[0]
    steps = []
    for model in FIG6_MODELS:
        tdir = f"{out}/fig6/train/{model}"
        argv = ["train", "--model", model, "--store", demos, "--out", tdir, "--seed", str(seed), "--preset", s.preset,
                "--max-steps", str(s.fig6_steps), "--batch-size", str(s.batch_size or 16), "--success-only",
                f"families={fam}", f"val_every={s.fig6_every}", f"keep_every={s.fig6_every}", *_device_argv(cfg),
                *cfg.train_overrides, *_init_argv(cfg, model)]
        meta = {"model": model, "family": fam, "seed": seed, "run": f"fig6_{model}", "batch_size": s.batch_size or 16}
        steps.append(Step(f"fig6-train-{model}", "fig6_train", argv, tdir, ("vla_train",), meta, after=after))
        for k in range(s.fig6_every, s.fig6_steps + 1, s.fig6_every):
            edir = f"{out}/fig6/eval/{model}/step_{k}"
            steps.append(Step(f"fig6-eval-{model}-{k}", "fig6_eval",
                              ["eval", "--task", f"quard:{fam}", "--policy", f"{tdir}/step_{k}.pt", "--out", edir,
                               "--colours", "train", "--episodes-per-cell", str(s.fig6_episodes),
                               "--num-envs", str(balanced_envs(s.fig6_episodes, s.num_envs)), "--seed", str(2000 + seed),
                               *_physics_argv(cfg)],
                              edir, ("quard_eval", "vla_policy"), {**meta, "step": k},
                              after=(f"fig6-train-{model}",)))
    return steps


def plan_markdown(scale: str, rounds: int = 2, seeds: tuple[int, ...] = (0, 1, 2), out: str = "runs/reproduce_quard") -> str:
    """The plan of one scale as docs/quard_auto.md prints it: each distinct command once per stage, with the
    varying parts written as {model} / {seed} / {family} / {round}."""
    cfg = QuardConfig(out=out, scale=scale, seeds=seeds, rounds=rounds).validate()
    steps = build_plan(cfg)
    lines, seen = [], set()
    for st in steps:
        text = st.command
        m = st.meta
        if st.stage in ("train", "eval"):
            text = text.replace(m["run"], "{run}").replace(f"--model {m['model']}", "--model {model}")
            if st.stage == "eval":
                text = text.replace(f"--seed {1000 + m['seed']}", "--seed {1000+seed}")
            else:
                text = text.replace(f"--seed {m['seed']}", "--seed {seed}")
            text = text.replace(f"/round{m['round']}", "/round{round}")
            if st.stage == "train":   # the (N) rows add --success-only
                text = text.replace(" --success-only", "") + " [--success-only]"
        key = (st.stage, text)
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"{st.stage:9s} {text}")
    n = {k: sum(1 for s in steps if s.stage == k) for k in ("demos", "pretrain", "auto", "train", "eval")}
    counts = ", ".join(f"{v} {k}" for k, v in n.items())
    return "\n".join(lines) + f"\n# {len(steps)} steps ({counts}) for --rounds {rounds} --seeds " + \
        ",".join(map(str, seeds))


# --- what this build can run --------------------------------------------------------------------------
def _options(command: str) -> set[str]:
    """The option strings `quadforge <command>` accepts in this build."""
    from quadforge.tools.cli import build_parser
    parser = build_parser(with_subcommand=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices[command]._option_string_actions)


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# capability -> (check, what is missing: named so the user knows which piece to wait for)
CAPABILITIES: dict[str, tuple[Callable[[], bool], str]] = {
    "quard_collect": (lambda: "--task" in _options("collect") and _has_module("quadforge.envs.quard.env"),
                      "`quadforge collect --task quard:...` (the QUARD task envs of issue 14, branch wave2-14a, "
                      "and the image store of wave2-14b)"),
    "quard_expert": (lambda: _has_module("quadforge.experts.quard_expert"),
                     "the privileged QUARD expert (`experts/quard_expert.py`, issue 14, branch wave2-14a)"),
    "vla_train": (lambda: _has_module("quadforge.training.vla") and _has_module("quadforge.data.image_sampler"),
                  "`quadforge train --model rt1|germ|germ-dense|germ-il` on an image store (issue 15, branch "
                  "wave2-15, reading windows through issue 14's image sampler, wave2-14b)"),
    "vla_policy": (lambda: _has_module("quadforge.experts.vla"),
                   "a trained VLA checkpoint as a `--policy` (the `vla` policy kind, issue 15, branch wave2-15)"),
    "quard_eval": (lambda: "--task" in _options("eval"),
                   "`quadforge eval --task quard:<family>` (closed-loop evaluation on the QUARD tasks, issue 14)"),
}


def missing_capabilities(steps: list[Step]) -> dict[str, str]:
    out = {}
    for need in sorted({n for s in steps for n in s.needs}):
        check, what = CAPABILITIES[need]
        if not check():
            out[need] = what
    return out


# --- completeness -----------------------------------------------------------------------------------------
def store_episodes(path: str, collector: str | None = None) -> int:
    if not Path(path).is_dir():
        return 0
    from quadforge.data.store import TrajectoryStore
    ids = TrajectoryStore.existing_episode_ids(path)
    return len(ids) if collector is None else sum(1 for i in ids if str(i).startswith(f"{collector}-"))


def step_record_path(out: str, step: Step) -> Path:
    return Path(out) / "steps" / f"{step.id}.json"


def step_log_path(out: str, step: Step) -> Path:
    """The step's process output (a resumed step appends to it; --status and the heartbeat read it)."""
    return Path(out) / "logs" / f"{step.id}.log"


def is_complete(cfg: QuardConfig, step: Step) -> bool:
    if step.stage in ("demos", "auto"):
        return store_episodes(step.output) >= int(step.meta["episodes"])
    if step.stage in TRAIN_STAGES:
        record = step_record_path(cfg.out, step)
        if not ((Path(step.output) / "last.pt").exists() and record.exists()):
            return False
        ran = json.loads(record.read_text()).get("argv")
        trained, asked = (max_steps(ran) if ran is not None else None), max_steps(step.argv)
        if ran is None or trained == asked:
            return True
        if trained is not None and asked is not None and trained < asked:
            return False   # continued to the new length (resume_argv: --resume)
        raise ValueError(f"{step.id}: {step.output} trained {trained or 'the preset length of'} steps and this run "
                         f"asks {asked or 'the preset length'} (--train-steps, --scale); a finished training is only "
                         f"ever continued to a longer budget: use a new --out")
    record = step_record_path(cfg.out, step)
    if not ((Path(step.output) / "eval.json").exists() and record.exists()):
        return False
    return not scored_an_earlier_model(cfg, step, json.loads(record.read_text()))


def scored_an_earlier_model(cfg: QuardConfig, step: Step, record: dict[str, Any]) -> bool:
    """Whether an evaluation ran before the last run of a training it reads began: a training continued to
    a longer --train-steps is a new model, and once it has finished nothing else says its old scores are
    stale (a runner restarted then, or --status, would keep them)."""
    started = record.get("started_utc") or ""
    for read in step.after:
        path = Path(cfg.out) / "steps" / f"{read}.json"
        trained = json.loads(path.read_text()) if path.exists() else {}
        if trained.get("stage") in TRAIN_STAGES and (trained.get("started_utc") or "") > started:
            return True
    return False


def max_steps(argv: list[str]) -> int | None:
    """A training command's ``--max-steps`` (None when it leaves the length to the preset)."""
    return int(argv[argv.index("--max-steps") + 1]) if "--max-steps" in argv else None


def steps_to_run(cfg: QuardConfig, steps: list[Step]) -> list[Step]:
    """The steps that are not complete, and every evaluation of a training that runs again: a training
    continued to a longer budget is a new model, so its old scores go. A complete collection that read
    such a training (a later flywheel round's) would keep data from the old model: a clear error instead."""
    todo: set[str] = set()
    trainings = {s.id for s in steps if s.stage in TRAIN_STAGES}
    for step in steps:   # in plan order: a step comes after every step it reads
        rerun = todo.intersection(step.after, trainings)
        if not is_complete(cfg, step):
            todo.add(step.id)
        elif rerun and step.stage in EVAL_STAGES:
            todo.add(step.id)
        elif rerun:
            raise ValueError(f"{step.id} is complete but read {', '.join(sorted(rerun))}, which runs again (a longer "
                             f"--train-steps?): its output would stay the old model's; use a new --out")
    return [s for s in steps if s.id in todo]


TRAIN_STAGES = ("pretrain", "train", "fig6_train")   # steps whose output is a training directory
EVAL_STAGES = ("eval", "fig6_eval")                   # steps that score a training's checkpoint


class StepFailed(RuntimeError):
    """A step's command exited non-zero; the steps before it are kept, a rerun resumes at it."""


# --- running ----------------------------------------------------------------------------------------------
def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def resume_argv(step: Step) -> list[str]:
    """The step's command, continuing an interrupted training run: from its ``last.pt`` (``--resume``), or
    afresh over a directory it left without one (``--overwrite``; the directory is this loop's own)."""
    argv = list(step.argv)
    if step.stage in TRAIN_STAGES and Path(step.output).is_dir():
        argv.append("--resume" if (Path(step.output) / "last.pt").exists() else "--overwrite")
    return argv


def clear_dead_attempt(step: Step) -> bool:
    """Remove a training directory an interrupted attempt left before its first checkpoint (TensorBoard
    files only, say): ``train`` refuses a non-empty folder that is not a run even with ``--overwrite``, and
    the folder is this loop's own, so there is nothing in it to keep. True when something was removed."""
    out = Path(step.output)
    if step.stage not in TRAIN_STAGES or not out.is_dir() or holds_run(out):
        return False
    shutil.rmtree(out)
    return True


def run_step(cfg: QuardConfig, step: Step, log: Callable[[str], None]) -> dict[str, Any]:
    """Run one step's command in its own process; its record (command, wall time) on success."""
    if clear_dead_attempt(step):
        log(f"[quard] {step.id}: cleared {step.output} (an interrupted attempt left no checkpoint)")
    argv = resume_argv(step)
    logfile = step_log_path(cfg.out, step)
    logfile.parent.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    t0 = time.perf_counter()
    if step.program == "copy":
        copy_store(*step.argv)
        wall = time.perf_counter() - t0
        record = {"id": step.id, "stage": step.stage, "command": step.command, "argv": argv, "meta": step.meta,
                  "started_utc": started, "wall_s": wall,
                  "collection": {**collection_stats(step.output, None), "episodes_per_min": None}}
        _write_json(step_record_path(cfg.out, step), record)
        log(f"[quard] {step.id}: done in {wall:.0f} s")
        return record
    collector = step.meta.get("collector", "expert")
    before = store_episodes(step.output, collector) if step.stage in ("demos", "auto") else 0
    # a finished training continued to a longer --train-steps (resumed over its record): the record keeps
    # the earlier runs' time; one started afresh (--overwrite) over a stale record does not inherit it
    prior = step_record_path(cfg.out, step)
    earlier = json.loads(prior.read_text()) if "--resume" in argv and prior.exists() else None
    with open(logfile, "a") as fh:   # a resumed step adds to its killed attempt's log, which stays readable
        fh.write(f"# {started} UTC: quadforge {shlex.join(argv)}\n")
        fh.flush()
        returncode = run_child([sys.executable, "-m", "quadforge.tools.cli", *argv], fh,
                               {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    wall = time.perf_counter() - t0
    if returncode != 0:
        tail = [ln for ln in logfile.read_text().splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise StepFailed(f"step {step.id} failed (exit {returncode}): {tail[0]} (command: "
                           f"{step.command}; log {logfile})")
    record = {"id": step.id, "stage": step.stage, "command": step.command, "argv": argv, "meta": step.meta,
              "started_utc": started, "wall_s": wall}
    if earlier is not None and "wall_s" in earlier:   # wall_s: the training's whole time, over its segments
        first = [{k: earlier.get(k) for k in ("argv", "started_utc", "wall_s")}]
        record["segments"] = earlier.get("segments", first) + [{"argv": argv, "started_utc": started, "wall_s": wall}]
        record["wall_s"] = wall + float(earlier["wall_s"])
    if step.stage in ("demos", "auto"):
        # a resumed collection's wall time covers only the episodes this invocation added
        record["collection"] = collection_stats(step.output, collector)
        record["collection"]["resumed_with"] = before
        added = record["collection"]["episodes"] - before
        record["collection"]["episodes_per_min"] = added / max(wall / 60, 1e-9) if added > 0 else None
    _write_json(step_record_path(cfg.out, step), record)
    log(f"[quard] {step.id}: done in {wall:.0f} s")
    return record


def copy_store(source: str, dest: str) -> None:
    """``dest`` becomes a copy of the store at ``source`` (through a temporary directory renamed at the end,
    so an interrupted copy leaves no half store behind). A ``dest`` that already holds a store is kept."""
    src, dst = Path(source), Path(dest)
    if store_episodes(str(dst)) > 0:
        return
    if store_episodes(str(src)) == 0:
        raise ValueError(f"{source}: no store with episodes to copy")
    tmp = dst.with_name(dst.name + ".copying")
    if tmp.exists():
        shutil.rmtree(tmp)
    if dst.exists():          # an empty or broken leftover of this loop's own directory
        shutil.rmtree(dst)
    # a concurrent writer's staging/lock files are not the store's committed content
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.lock"))
    os.replace(tmp, dst)


def collection_stats(store: str, collector: str | None) -> dict[str, Any]:
    """Successes and failures of one collector's episodes (``None``: every episode) in a store, per family
    when the store says it."""
    from quadforge.data.store import TrajectoryStore
    st = TrajectoryStore.open(store)
    table = st.episodes
    ids = [str(i) for i in st.episode_ids]
    mine = [k for k, i in enumerate(ids) if collector is None or i.startswith(f"{collector}-")]
    success = table["success"] if "success" in table else None
    fam_col = next((c for c in ("family", "task") if c in table), None)
    per: dict[str, dict[str, int]] = {}
    for k in mine:
        fam = str(table[fam_col][k]).removeprefix("quard:") if fam_col else "all"
        ok = bool(success[k]) if success is not None else False
        d = per.setdefault(fam, {"successes": 0, "failures": 0})
        d["successes" if ok else "failures"] += 1
    return {"store": store, "collector": collector or "all", "episodes": len(mine), "per_family": per,
            "success_labels": success is not None}


# the frame size each preset is sized for: the cpu preset's 64² camera, RT-1's 300² for the paper one
PRESET_IMAGE_SIZE = {"cpu": (64, 64), "paper": (300, 300)}


def preset_parameters() -> dict[str, Any]:
    """Total and active parameters of every Table III model at the cpu (shipped) and paper presets, counted
    on the meta device (nothing is allocated), with the word vocabulary of the whole quard:all instruction
    table. The report prints these next to seed 003's 39.31 M active of 83.48 M for GeRM."""
    import torch

    from quadforge.envs.quard.instructions import instruction_table, task_families
    from quadforge.models.registry import build_vla_model
    from quadforge.training.vla import default_config, model_config
    table = list(instruction_table(task_families("quard:all")))
    out: dict[str, Any] = {}
    for preset, size in PRESET_IMAGE_SIZE.items():
        counts = {}
        for model in MODEL_NAMES:
            with torch.device("meta"):
                net = build_vla_model(model, model_config(default_config(model, preset), size, table))
            counts[model] = {k: int(v) for k, v in net.parameter_counts().items()}
        out[preset] = {"image_size": list(size), "instructions": len(table), "models": counts}
    return out


def parameters_of(checkpoint: Path) -> dict[str, Any] | None:
    """Active / total parameters recorded in a VLA checkpoint's provenance (training/vla.py writes them)."""
    try:
        from quadforge.models.checkpoint import load_checkpoint
        ck = load_checkpoint(str(checkpoint))
    except Exception:   # an unreadable checkpoint has no counts; the eval step itself reports the error
        return None
    p = (ck.provenance or {}).get("parameters")
    return dict(p) if isinstance(p, dict) else None


def family_counts(step: Step, families: tuple[str, ...] | list[str]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """(successes, episodes) per family of an evaluation step (the colour sets of a family pooled), from its
    ``eval.json``'s ``families[colours][family]``, and the colour sets it held; a clear error when the file
    lacks a family."""
    ev = json.loads((Path(step.output) / "eval.json").read_text())
    by_colours = ev.get("families")
    if not isinstance(by_colours, dict) or not by_colours:
        raise ValueError(f"{step.output}/eval.json has no per-family results ('families'); cannot score {step.id}")
    counts = {}
    for fam in families:
        rows = [r[fam] for r in by_colours.values() if fam in r]
        if not rows:
            raise ValueError(f"{step.output}/eval.json has no results for family {fam!r}; cannot score {step.id}")
        counts[fam] = (sum(int(round(float(r["success"]) * int(r["episodes"]))) for r in rows),
                       sum(int(r["episodes"]) for r in rows))
    return counts, sorted(by_colours)


def eval_results(cfg: QuardConfig, step: Step, train_record: dict[str, Any] | None,
                 eval_record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One evaluation's stored results, per family: successes / episodes of one model, seed and round."""
    counts, colour_sets = family_counts(step, family_names())
    m = step.meta
    params = parameters_of(Path(step.argv[step.argv.index("--policy") + 1]))
    return {fam: {**{key: m[key] for key in ("model", "failures", "round", "seed", "run")}, "family": fam,
                  "successes": k, "episodes": n, "colour_sets": colour_sets, "parameters": params,
                  "train_wall_s": (train_record or {}).get("wall_s"), "eval_wall_s": eval_record["wall_s"],
                  "train_command": (train_record or {}).get("command"), "eval_command": step.command}
            for fam, (k, n) in counts.items()}


def fig6_result(step: Step, record: dict[str, Any]) -> dict[str, Any]:
    """One Fig. 6 point: a checkpoint's successes on its family, at its step and epoch (windows seen over the
    training windows, which the checkpoint's provenance records)."""
    from quadforge.models.checkpoint import load_checkpoint
    (k, n), = family_counts(step, [step.meta["family"]])[0].values()
    ckpt = Path(step.argv[step.argv.index("--policy") + 1])
    windows = (load_checkpoint(str(ckpt)).provenance or {}).get("train_windows")
    epoch = step.meta["step"] * step.meta["batch_size"] / windows if windows else None
    return {**step.meta, "successes": k, "episodes": n, "train_windows": windows, "epoch": epoch,
            "eval_wall_s": record["wall_s"], "eval_command": step.command}


# The steps' processes running now. Why: a runner stopped by SIGTERM (`kill`, a scheduler's time limit)
# would otherwise leave them running as orphans, and a rerun would start the same trainings beside them,
# both writing one checkpoint. Stopping the runner stops them; a rerun resumes each from its checkpoint.
_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()


def run_child(cmd: list[str], log_file, env: dict[str, str]) -> int:
    """Run one step's process to its end (output to ``log_file``), registered so ``stop_children`` reaches it."""
    env = {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}   # ends with the runner
    with _CHILDREN_LOCK:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        _CHILDREN.add(proc)
    try:
        return proc.wait()
    finally:
        with _CHILDREN_LOCK:
            _CHILDREN.discard(proc)


def stop_children(grace_s: float = 30.0) -> int:
    """SIGTERM every running step's process, SIGKILL those still alive after ``grace_s``; how many ran."""
    with _CHILDREN_LOCK:
        procs = list(_CHILDREN)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return len(procs)


class _StopOnSigterm:
    """Within it, SIGTERM raises ``SystemExit(143)`` in the main thread (the default handler would end the
    runner at once and orphan its steps); outside the main thread it changes nothing."""

    def __enter__(self):
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise SystemExit(128 + signum)
            self._previous = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


# while steps run, the runner writes a line this often: a run followed in a log file (nohup, a scheduler)
# otherwise says nothing between a training's start and its end, an hour or more at --train-steps 24000
HEARTBEAT_S = 600.0


def step_training(out: str, step: Step) -> tuple[TrainingProgress | None, int | None, bool]:
    """A training step's last logged progress, the steps it runs to (its ``--max-steps``, else what the
    logged run was asked for), and whether that line is this run's: a continued training's log also holds
    the earlier, shorter run's lines, and a copied or just-resumed log ends with them."""
    p = training_progress(step_log_path(out, step), batch_size_of(step.argv))
    target = max_steps(step.argv) or (p.of if p else None)
    return p, target, p is not None and p.of == target


def heartbeat(cfg: QuardConfig, running: list[Step], started: dict[str, float]) -> str:
    """One line on the running steps: a training's step and time left from its log, the others' time so far."""
    now, parts = time.time(), []
    for step in running:
        p, target, this_run = step_training(cfg.out, step) if step.stage in TRAIN_STAGES else (None, None, False)
        if this_run:
            parts.append(f"{step.id} {p.describe(target)}")
        else:
            parts.append(f"{step.id} running for {(now - started.get(step.id, now)) / 60:.0f} min")
    return f"[quard] {time.strftime('%H:%M', time.gmtime(now))} UTC: " + "; ".join(parts)


def run_steps(cfg: QuardConfig, todo: list[Step], jobs: int, log: Callable[[str], None],
              finished: Callable[[Step, dict[str, Any], bool], None]) -> None:
    """Run ``todo`` in plan order, up to ``jobs`` at once, each only after the steps it reads (``after``)
    are done. A failure lets the running steps finish (their outputs are kept) and starts no new one, then
    raises; a rerun resumes from there. Ctrl-C or SIGTERM also stops the running steps' processes (their
    checkpoints stay; they get no step record) before the runner exits."""
    from concurrent.futures import ThreadPoolExecutor

    with _StopOnSigterm(), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            _schedule(cfg, todo, jobs, pool, log, finished)
        except (KeyboardInterrupt, SystemExit):
            stopped = stop_children()
            log(f"[quard] stopped: {stopped} running step(s) ended; the same command resumes the run")
            raise


def _schedule(cfg: QuardConfig, todo: list[Step], jobs: int, pool, log: Callable[[str], None],
              finished: Callable[[Step, dict[str, Any], bool], None]) -> None:
    """``run_steps``' loop on ``pool``: the first ``StepFailed`` is raised once the running steps end."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending = list(todo)
    waiting_on = {s.id for s in todo}
    running: dict[Any, Step] = {}
    started: dict[str, float] = {}
    failure: StepFailed | None = None
    while pending or running:
        if failure is None:
            for step in [s for s in pending if not set(s.after) & waiting_on][:max(0, jobs - len(running))]:
                pending.remove(step)
                log(f"[quard] {step.id}: {step.command}")
                running[pool.submit(run_step, cfg, step, log)] = step
                started[step.id] = time.time()
        if not running:
            break
        done, _ = wait(running, timeout=HEARTBEAT_S, return_when=FIRST_COMPLETED)
        if not done:
            log(heartbeat(cfg, list(running.values()), started))
        for fut in done:
            step = running.pop(fut)
            try:
                record = fut.result()
            except StepFailed as err:
                failure = failure or err
                continue
            waiting_on.discard(step.id)
            finished(step, record, True)
    if failure is not None:
        raise failure


def run_quard(cfg: QuardConfig, log: Callable[[str], None] = print, command: str | None = None,
              jobs: int = 1) -> Path:
    from quadforge.progress import progress_bar
    from quadforge.tools.run_info import git_state, machine

    cfg.validate()
    out = Path(cfg.out)
    steps = build_plan(cfg)
    todo = steps_to_run(cfg, steps)   # before anything is written: a budget it cannot meet is an error
    meta_path = out / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta.update({"config": asdict(cfg), "scale": asdict(cfg.sizes),
                 "started_utc": meta.get("started_utc") or time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                 "commands": meta.get("commands", []) + ([command] if command else []),
                 "machine": machine(), "git": git_state()})
    if "preset_parameters" not in meta:
        meta["preset_parameters"] = preset_parameters()
    _write_json(meta_path, meta)
    missing = missing_capabilities(todo)
    if missing:
        first = next(s for s in todo if set(s.needs) & set(missing))
        raise NotImplementedError(
            f"step {first.id} (`{first.command}`) needs {missing[sorted(set(first.needs) & set(missing))[0]]}, "
            f"which this build lacks; missing in all: {', '.join(sorted(missing))}. No step was run; "
            f"{len(steps) - len(todo)} of {len(steps)} steps are already complete")
    bar = progress_bar(len(steps), len(steps) - len(todo), desc="reproduce quard", unit="step")
    records = {s.id: json.loads(step_record_path(cfg.out, s).read_text())
               for s in steps if step_record_path(cfg.out, s).exists()}

    def finished(step: Step, record: dict[str, Any] | None, ran: bool) -> None:
        if record is not None:
            records[step.id] = record
            bar.update(1)
        if step.stage == "eval":
            paths = {fam: out / "results" / f"{step.meta['run']}_{fam}.json" for fam in family_names()}
            if ran or not all(p.exists() for p in paths.values()):   # an evaluation run again replaces its results
                per = eval_results(cfg, step, records.get(f"train-{step.meta['run']}"), records[step.id])
                for fam, path in paths.items():
                    _write_json(path, per[fam])

        if step.stage == "fig6_eval":
            path = out / "results" / "fig6" / f"{step.meta['model']}_step{step.meta['step']}.json"
            if ran or not path.exists():
                _write_json(path, fig6_result(step, records[step.id]))

    for step in steps:
        if step not in todo:
            finished(step, None, ran=False)
    run_steps(cfg, todo, jobs, log, finished)
    bar.close()
    meta["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    _write_json(meta_path, meta)
    return update_docs(out, Path(cfg.docs))


# --- CLI (through tools/reproduce.py) -----------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", choices=SCALES, default=None, help="quard stage sizes: tiny (plumbing), cpu (this "
                   "machine, hours), power (evaluation sized to tell rows 15 points apart with 80 %% power: 167 "
                   "episodes a row; docs/quard_auto.md), paper (seed 003's sizes, a GPU cluster); default cpu")
    p.add_argument("--rounds", type=int, default=None, help="quard stage: collection rounds of the data flywheel "
                   "(round k+1 collects with round k's GeRM); default 1")
    p.add_argument("--demos", default=None, metavar="STORE", help="quard stage: an existing demonstration store "
                   "(quadforge collect --task quard:all --policy quard_expert) instead of collecting one")
    p.add_argument("--fig6", default=None, metavar="FAMILY", help="quard stage: also seed 003's Fig. 6 on one family "
                   "(e.g. go_to): RT-1-style, GeRM w/o RL, GeRM w/o MoE and GeRM on its demonstrations alone, success "
                   "against training epochs")
    p.add_argument("--train-override", action="append", default=None, metavar="KEY=VALUE", help="quard stage: a "
                   "training option for every training step (repeatable), e.g. early_share=0.5; use a new --out")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="quard stage: run up to N steps at once "
                   "(trainings and evaluations that do not read each other's outputs), one core each; default 1")
    p.add_argument("--pretrained", default=None, metavar="CKPT", help="quard stage: a pre-trained VLA checkpoint "
                   "(e.g. in experts/checkpoints/) as round 0's collector instead of training one")
    p.add_argument("--init", action="append", default=None, metavar="MODEL=CKPT", help="quard stage: every training "
                   "of MODEL starts from CKPT's weights (repeatable), e.g. rt1=experts/checkpoints/vla_rt1.pt; use a new --out")
    p.add_argument("--device", default=None, help="quard stage: the trainings' torch device (cpu, cuda); default cpu")
    p.add_argument("--backend", default=None, choices=list(BACKENDS), help="quard stage: the collections' and "
                   "evaluations' physics backend (mujoco_warp: MuJoCo Warp, on a GPU with --warp-device cuda:0); "
                   "default mujoco_cpu")
    p.add_argument("--warp-device", default=None, help="quard stage, --backend mujoco_warp: Warp device (cuda:0, cpu)")
    p.add_argument("--status", action="store_true", help="quard stage: where the run in --out stands (steps done, a "
                   "training's step and time left from its log), its last command's plan with the flags given now; "
                   "runs nothing")
    p.add_argument("--pool", action="append", default=None, metavar="OUT", help="quard stage, with --report-only: "
                   "pool the results of another run of the same experiment on other seeds (e.g. one cluster job per "
                   "seed) into --out's table; repeatable")


def quard_out(args: argparse.Namespace) -> str:
    """--out, where the imitation stages' default (runs/reproduce) gives way to the loop's own."""
    return args.out if args.out != "runs/reproduce" else "runs/reproduce_quard"


def run_from_args(args: argparse.Namespace, seeds: tuple[int, ...] | None) -> int:
    out = quard_out(args)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give the number of steps to run at once, >= 1 (one core each)")
    if args.report_only:
        if not (Path(out) / "run.json").exists():
            raise FileNotFoundError(f"--report-only: no {out}/run.json; run `quadforge reproduce --stages quard` first")
        print(f"wrote {update_docs(Path(out), Path(args.docs), [Path(p) for p in args.pool or ()])}")
        return 0
    if args.pool:
        raise ValueError("--pool: only with --report-only (it rebuilds one table from finished runs; each run "
                         "runs by itself)")
    kw = given_fields(args, seeds)
    command = "quadforge " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
    try:
        cfg = QuardConfig(out=out, docs=args.docs, **kw)
        print(f"wrote {run_quard(cfg, command=command, jobs=args.jobs or 1)}")
    except StepFailed as err:   # one line naming the step, its command and its log; rerun to resume
        print(f"quadforge reproduce: error: {err}", file=sys.stderr)
        return 1
    return 0


def given_fields(args: argparse.Namespace, seeds: tuple[int, ...] | None) -> dict[str, Any]:
    """The QuardConfig fields the command line sets (the others keep their defaults, or with --status the
    run's own)."""
    kw: dict[str, Any] = {}
    for name in ("scale", "demos", "pretrained", "fig6"):
        if getattr(args, name):
            kw[name] = getattr(args, name)
    if args.rounds is not None:
        kw["rounds"] = args.rounds
    if args.train_override:
        kw["train_overrides"] = tuple(args.train_override)
    if args.init:
        kw["init"] = tuple(args.init)
    for name in ("device", "backend", "warp_device"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if getattr(args, "train_steps", None) is not None:
        kw["train_steps"] = args.train_steps
    if seeds:
        kw["seeds"] = seeds
    return kw
