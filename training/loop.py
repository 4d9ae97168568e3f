"""What every trainer's loop shares: the step loop, the TensorBoard log and the checkpoint files of a run.

``TrainLoop.run`` is the one skeleton under the trainers (``training.imitation``, ``training.qlearning``,
``training.vla``): optimizer step with gradient clipping, a logged row every ``log_every`` steps (loss terms averaged over
ranks, lr, grad norm, throughput), validation and ``last.pt`` every ``val_every`` steps and at the end,
a wall-time ``last.pt`` in between, and the progress bar. A trainer supplies only its batch -> loss terms
step (``loss_terms``), what follows an optimizer step (GeRM's EMA target), its validation and its
checkpoint contents (``checkpoint(step, rngs)``). All write

- ``OUT/tb/``: TensorBoard scalars ``<group>/<name>`` (main rank only; a missing tensorboard package
  only disables them),
- ``OUT/last.pt`` at every validation/checkpoint step and ``OUT/step_<n>.pt`` when kept;

and resume from ``OUT/last.pt`` (``models.checkpoint.latest_checkpoint``) with the random streams
of every rank restored (``rng_state`` / ``set_rng_state``, in the checkpoint's ``extra["rng"]``): torch's
generator (dropout, MoE gating noise, DrQ shifts) and any named numpy generator (GeRM's transition
sampler); ``resume_from`` restores optimizer, scheduler, target network and those streams in one call.
Imitation batches come from streams derived from (seed, rank, step), so they need no saved state; the VLA
trainer's store batches restart from such a stream at every checkpoint.
"""
from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from quadforge.data.locks import acquire
from quadforge.errors import Interrupted
from quadforge.output_paths import RUN_LOCK
from quadforge.overrides import apply_overrides, parse_overrides
from quadforge.models.checkpoint import Checkpoint, save_checkpoint
from quadforge.progress import progress_bar
from quadforge.training.curves import append_val_row, restart_val_curve
from quadforge.training.distributed import DistInfo, all_reduce_mean, barrier
from quadforge.training.optim import clip_gradients


AMP_MODES = ("off", "bf16")


class NonFiniteLoss(ValueError):
    """A training step's loss is NaN or inf (``TrainLoop`` stops there; a ValueError: the CLI's one line)."""


def check_amp(amp: str) -> None:
    if amp not in AMP_MODES:
        raise ValueError(f"amp={amp!r} unknown; allowed: {AMP_MODES}")


def autocast(device: torch.device, amp: str):
    """The forward's mixed-precision context: bf16 autocast on the run's device (``amp="bf16"``), or
    nothing. Gradients, optimizer state and weights stay float32."""
    check_amp(amp)
    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


class RunLog:
    """TensorBoard scalars of one run (a no-op off the main rank, without ``out`` or when disabled), and
    the validation rows as JSON lines in ``OUT/val.jsonl`` (with or without TensorBoard: the loss curves
    a report reads without a TensorBoard reader).

    ``resumed_at``: the checkpoint step a resumed run continues from. The killed run may have logged
    steps after that checkpoint; the writer asks TensorBoard to drop every earlier event after it
    (``purge_step`` = the first step the resumed run logs), and ``val.jsonl`` keeps only its rows up to
    that step, so those steps are written once, by the resumed run, and the rows up to the checkpoint stay."""

    def __init__(self, out: Path | None, is_main: bool, enabled: bool = True, who: str = "train",
                 resumed_at: int = 0):
        self.writer, self.who, self.curve, self._lock = None, who, None, None
        if out is None or not is_main:
            return
        # before the first write: a second training into the same --out at once would interleave with this
        # one's files (each would report its run as written, one of them silently lost)
        self._lock = acquire(Path(out) / RUN_LOCK, f"training {who}",
                             hint="one training per --out at a time: wait for it to finish, or train into another --out")
        self.curve = restart_val_curve(Path(out), resumed_at)
        if not resumed_at:   # a fresh run (an --overwrite, or a rerun of one stopped before its first checkpoint)
            shutil.rmtree(Path(out) / "tb", ignore_errors=True)   # logs no curves of the run it replaces
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:   # tensorboard is a dependency; without it training still runs
            print(f"{who}: tensorboard not importable; no TensorBoard logs")
            return
        self.writer = SummaryWriter(log_dir=str(Path(out) / "tb"), purge_step=resumed_at + 1 if resumed_at else None)

    def scalars(self, group: str, row: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        for k, v in row.items():
            if k != "step":
                self.writer.add_scalar(f"{group}/{k}", v, step)

    def line(self, group: str, head: str, row: Mapping[str, float], step: int) -> None:
        """Print ``[who] head k=v ...`` and write the same scalars under ``group/`` (call on the main rank)."""
        print(f"[{self.who}] {head} " + " ".join(f"{k}={v:.4g}" for k, v in row.items() if k != "step"), flush=True)
        self.scalars(group, row, step)
        if group == "val":
            self.val_row(step, row)

    def val_row(self, step: int, row: Mapping[str, float]) -> None:
        """Append one validation's numbers to ``OUT/val.jsonl`` (main rank; ``line`` does it for ``val``)."""
        if self.curve is not None:
            append_val_row(self.curve, step, row)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def save_run_checkpoint(out: Path, ckpt: Checkpoint, step: int, keep: bool) -> Path:
    """``OUT/last.pt`` (and ``OUT/step_<step>.pt`` when ``keep``); the path of last.pt."""
    last = save_checkpoint(Path(out) / "last.pt", ckpt)
    if keep:
        save_checkpoint(Path(out) / f"step_{step}.pt", ckpt)
    return last


# --- random streams on resume ----------------------------------------------------------------------------
def rng_state(info: DistInfo, generators: Mapping[str, np.random.Generator] | None = None) -> dict[str, Any]:
    """Every rank's random streams, gathered (a collective: call it on every rank): ``{"rank<r>": {"torch":
    CPU generator state, ["cuda": ...,] <name>: numpy generator state}}``. What a bit-exact resume needs
    beyond streams derived from (seed, rank, step)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if info.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(info.device)
    for name, gen in (generators or {}).items():
        state[name] = gen.bit_generator.state
    states = [state]
    if info.enabled:
        import torch.distributed as dist
        states = [None] * info.world_size
        dist.all_gather_object(states, state)
    return {f"rank{r}": s for r, s in enumerate(states)}


def set_rng_state(saved: Mapping[str, Any] | None, info: DistInfo,
                  generators: Mapping[str, np.random.Generator] | None = None) -> bool:
    """Restore this rank's streams from ``rng_state``'s dict; False when the checkpoint has none for it."""
    state = (saved or {}).get(f"rank{info.rank}")
    if state is None:
        return False
    torch.set_rng_state(state["torch"])
    if info.device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], info.device)
    for name, gen in (generators or {}).items():
        if name in state:
            gen.bit_generator.state = state[name]
    return True


def check_resume_provenance(out: Path, ckpt: Checkpoint, provenance: Mapping[str, Any], data_keys: Sequence[str],
                            config: Mapping[str, Any], config_keys: Sequence[str], takes_init_from: bool = True) -> None:
    """A resume continues the batches the interrupted run would have drawn only on the same data and
    draws: a store that has grown since re-splits train and validation (validation episodes become
    training ones) and changes the counts in ``data_keys`` both provenances record; another value of a
    ``config_keys`` field (seed, batch size, split, ...) draws other batches. Refused, naming what changed
    (and, for a trainer that ``takes_init_from``, the override that starts a new run from the weights)."""
    total = config.get("max_steps")
    if isinstance(total, int) and ckpt.step > total:   # equal: the finished run's rerun, which saves it again
        raise ValueError(f"--resume {out}: --max-steps {total} is below the checkpoint's step {ckpt.step}; "
                         f"--max-steps is the run's total, so a resume gives one >= {ckpt.step}")
    was, then = ckpt.provenance or {}, ckpt.train_config or {}
    differ = [f"{key} {was[key]!r} then, {provenance[key]!r} now" for key in data_keys
              if key in was and key in provenance and was[key] != provenance[key]]
    differ += [f"{key} {then[key]!r} then, {config[key]!r} now" for key in config_keys
               if key in then and key in config and then[key] != config[key]]
    if differ:
        start = f" (init_from={Path(out) / 'last.pt'} starts from its weights)" if takes_init_from else ""
        raise ValueError(f"--resume {out}: the run was made on other data or draws ({'; '.join(differ)}); a resume "
                         f"would not continue it. Train into a new --out{start}")


def resume_from(ckpt: Checkpoint, optimizer: torch.optim.Optimizer, scheduler: Any, info: DistInfo,
                target: torch.nn.Module | None = None,
                generators: Mapping[str, np.random.Generator] | None = None) -> int:
    """Continue a run from ``ckpt`` (its weights already loaded): the optimizer and scheduler states, the
    target network (``extra["target_state_dict"]``) when there is one, every random stream; the step to
    continue from."""
    optimizer.load_state_dict(ckpt.optimizer)
    scheduler.load_state_dict(ckpt.scheduler)
    if target is not None:
        target.load_state_dict(ckpt.extra["target_state_dict"])
    set_rng_state(ckpt.extra.get("rng"), info, generators)
    return int(ckpt.step)


# --- the step loop ---------------------------------------------------------------------------------------
@dataclass
class TrainLoop:
    """One training run's step loop; the trainer's parts are the callables.

    ``loss_terms(step) -> {"loss": tensor, ...}`` draws the step's batch and computes the terms (``loss``
    is minimised; every term is logged, averaged over ranks). ``after_step()`` runs after each optimizer
    step. ``validate(step) -> {name: value}`` runs on every rank at validation steps; what it returns
    joins that step's logged row. ``report(row)`` prints/logs a row on the main rank.
    ``checkpoint(step, rngs, scheduled)`` writes ``last.pt`` (main rank; ``rngs`` from ``rng_state`` or
    None; ``scheduled``: a validation step, not a wall-time save) and returns its path. ``generators`` are the named numpy streams saved with torch's on resume.
    """

    info: DistInfo
    optimizer: torch.optim.Optimizer
    scheduler: Any
    clip_module: torch.nn.Module          # whose gradients are clipped
    grad_clip: float
    loss_terms: Callable[[int], Mapping[str, torch.Tensor]]
    checkpoint: Callable[[int, dict | None, bool], Path | None]
    report: Callable[[dict[str, float]], None]
    max_steps: int
    log_every: int
    val_every: int
    items_per_step: int                   # samples per step over all ranks (for the throughput column)
    rate_name: str = "samples_per_s"
    checkpoint_every_s: float = 0.0
    desc: str = "train"
    after_step: Callable[[], None] | None = None
    validate: Callable[[int], Mapping[str, float] | None] | None = None
    generators: Mapping[str, np.random.Generator] = field(default_factory=dict)
    amp: str = "off"                      # "bf16": the forward (loss_terms) under bf16 autocast
    history: list[dict[str, float]] = field(default_factory=list)
    last_path: Path | None = None
    last_step: int | None = None          # the step of last_path

    def save(self, step: int, collective: bool = True) -> Path | None:
        """``last.pt`` at ``step`` with every rank's random streams (``collective``: call it on every rank)
        or, off the collective schedule, with this process's streams when it is the only one."""
        rngs = rng_state(self.info, self.generators) if collective or not self.info.enabled else None
        if collective or self.info.is_main:
            path = self.checkpoint(step, rngs, collective)
            if path is not None:
                self.last_path, self.last_step = path, step
        return self.last_path

    def _watch_finite(self, step: int, terms: Mapping[str, torch.Tensor]) -> None:
        """Marks the first step whose loss is NaN or inf, on the device: no host read (on a GPU a read each
        step would stall the queue; ``_check_finite`` reads the mark when the loss is read for the log)."""
        bad = ~torch.isfinite(terms["loss"].detach()).all()
        self._first_bad.masked_fill_(bad & (self._first_bad < 0), step + 1)

    def _check_finite(self, done: int, terms: Mapping[str, torch.Tensor], collective: bool = True) -> bool:
        """Whether every loss so far was finite; at a collective point (a log row, before ``last.pt``) a
        ``NonFiniteLoss`` otherwise: one NaN step makes every weight NaN, and the run would go on to 'finish'
        and overwrite ``last.pt`` with them; stopped here, the checkpoint on disk stays the last good one.
        Under DDP the ranks agree first (a rank stopping alone would leave the others waiting); off the
        collective schedule (a wall-clock save) it only answers, and the caller skips that save."""
        first = int(self._first_bad)
        if not collective:
            return first < 0
        if not (all_reduce_mean(float(first >= 0), self.info) > 0 if self.info.enabled else first >= 0):
            return True
        values = ", ".join(f"{k}={float(v.detach()):.4g}" for k, v in terms.items() if torch.is_tensor(v) and v.numel() == 1)
        where = (f"from step {first} on" + (f" on rank {self.info.rank}" if self.info.enabled else "")
                 if first >= 0 else "on another rank")
        kept = (f"the last good checkpoint, {self.last_path} (step {self.last_step}), is kept" if self.last_path
                else f"the checkpoint it resumed from (step {self._start}) is kept" if self._start
                else "this run wrote no checkpoint")
        raise NonFiniteLoss(f"{self.desc}: the training loss is not finite {where} (at step {done}: {values}); "
                            f"stopped before saving: {kept}. Check the data (`quadforge dataset validate --deep`) "
                            f"or lower the learning rate")

    def run(self, start: int) -> list[dict[str, float]]:
        try:
            return self._run(start)
        except KeyboardInterrupt as err:
            if isinstance(err, Interrupted):
                raise
            kept = (f"{self.last_path} holds step {self.last_step} of {self.max_steps}" if self.last_path
                    else f"the checkpoint it resumed from holds step {start}" if start
                    else "no checkpoint was written yet")
            raise Interrupted(f"{self.desc} stopped; {kept}", resumable=bool(self.last_path or start)) from None

    def _run(self, start: int) -> list[dict[str, float]]:
        info = self.info
        t0, seen = time.perf_counter(), 0
        last_saved = time.monotonic()
        bar = progress_bar(self.max_steps, start, desc=self.desc, enabled=info.is_main)
        self._first_bad = torch.full((), -1, dtype=torch.long, device=info.device)
        self._start = start
        for step in range(start, self.max_steps):
            with autocast(info.device, self.amp):
                terms = self.loss_terms(step)
            self._watch_finite(step, terms)
            self.optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            grad_norm = clip_gradients(self.clip_module, self.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            if self.after_step is not None:
                self.after_step()
            seen += self.items_per_step
            done = step + 1
            validate = done % self.val_every == 0 or done == self.max_steps
            if done % self.log_every == 0 or validate:
                self._check_finite(done, terms)
                row: dict[str, Any] = {"step": done}
                row.update({k: all_reduce_mean(v.detach() if torch.is_tensor(v) else v, info) for k, v in terms.items()})
                row.update(lr=self.optimizer.param_groups[0]["lr"], grad_norm=float(grad_norm))
                row[self.rate_name] = seen / max(time.perf_counter() - t0, 1e-9)
                if validate and self.validate is not None:
                    row.update(self.validate(done) or {})
                self.history.append(row)
                if info.is_main:
                    self.report(row)
                if not bar.disable:   # the loss as logged: reading it every step would sync a GPU each step
                    bar.set_postfix(loss=f"{float(row['loss']):.4g}", refresh=False)
                t0, seen = time.perf_counter(), 0
            if validate:
                self.save(done)   # a collective: every rank reaches it at the same steps
                last_saved = time.monotonic()
                barrier(info)
            elif (self.checkpoint_every_s and time.monotonic() - last_saved >= self.checkpoint_every_s
                  and self._check_finite(done, terms, collective=False)):
                # by wall time too, so a slow run never goes long without a resumable last.pt. Ranks
                # reach this at different steps: no collective, so under DDP without random streams.
                self.save(done, collective=False)
                last_saved = time.monotonic()
            bar.update(1)
        bar.close()
        return self.history


# the step-count flags every trainer takes (docs/cli.md)
COMMON_STEP_FLAGS = ("max_steps", "batch_size", "log_every", "val_every")


def apply_trainer_args(cfg: Any, args: Any, fields: tuple[str, ...] = COMMON_STEP_FLAGS) -> Any:
    """A Q-learning or VLA trainer config from the command line: ``--seed``, the step-count flags given,
    ``--success-only`` (successful episodes only, no mixing ratio), then ``key=value`` overrides; validated."""
    cfg.seed = int(getattr(args, "seed", 0) or 0)
    for name in fields:
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg, name, value)
    if getattr(args, "success_only", False):
        cfg.success_only, cfg.success_ratio = True, None
    if getattr(args, "amp", None):
        cfg.amp = str(args.amp)
    apply_overrides(cfg, parse_overrides(getattr(args, "overrides", None)))
    cfg.validate()
    return cfg
