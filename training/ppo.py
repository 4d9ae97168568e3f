"""``quadforge train-expert``: PPO experts trained with rsl_rl's real ``OnPolicyRunner`` on ``LeggedEnv``.

Two presets (``PPOPreset``):

- ``legged_gym``: legged_gym's ``LeggedRobotCfgPPO`` - actor/critic [512, 256, 128] ELU, init std 1.0,
  lr 1e-3 with the adaptive-KL schedule (target 0.01), 5 epochs x 4 minibatches, clip 0.2, gamma 0.99,
  lambda 0.95, entropy 0.01, value coef 1.0, grad norm 1.0, 24 steps per env per iteration, 4096 envs.
- ``cpu``: the same algorithm scaled to a 2-core machine. MuJoCo on one CPU thread steps ~2k env steps/s,
  so 4096 envs x 24 steps would be ~50 s of simulation per iteration; 256 envs keep an iteration at a few
  seconds and let the adaptive schedule react often. With ~16x fewer samples per update the
  [256, 128, 64] nets are enough capacity, update ~4x faster on the CPU and keep the checkpoint
  (with optimiser state) under 2 MB.

The actor reads the env's ``policy`` group (``legged_gym_48``: noisy proprioception + base linear
velocity + joystick command), the critic the privileged ``critic`` group (``legged_gym_235``: the same,
noise-free, plus the 187-point height scan). Every checkpoint is rsl_rl 5's own format with a
``infos["quadforge"]`` block (robot, the actor's ``ObsLayout.to_dict()``, preset, command) that
``experts.loaders.load_expert`` uses to rebuild the policy without being told the layout.
"""
from __future__ import annotations


import argparse
import contextlib
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from quadforge.cli_flags import add_num_envs, add_num_threads, add_seed
from quadforge.envs.robots import add_robot
from quadforge.data.locks import acquire
from quadforge.envs.backends import add_backend_arguments, backend_from_args
from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.builder import make_env
from quadforge.envs.terrain import TERRAIN_SPEC_HELP
from quadforge.experts.loaders import RSL_RL_PREFIX, _torch_load, latest_rsl_rl_checkpoint, rsl_rl_checkpoints
from quadforge.overrides import apply_overrides, parse_overrides
from quadforge.seeding import seed_everything
from quadforge.output_paths import RUN_LOCK, check_output_dir, file_written_whole, made_folder_removed_on_failure
from quadforge.training.distributed import DistInfo, barrier, cleanup, init_distributed

PRESETS_HELP = "legged_gym (the paper's PPO settings, 4096 envs) or cpu (scaled to a 2-core machine)"


@dataclass(frozen=True)
class PPOPreset:
    """rsl_rl PPO + model settings; every field can be overridden with ``key=value`` on the command line."""

    num_envs: int = 4096
    num_steps_per_env: int = 24
    actor_hidden_dims: tuple[int, ...] = (512, 256, 128)
    critic_hidden_dims: tuple[int, ...] = (512, 256, 128)
    activation: str = "elu"
    init_noise_std: float = 1.0
    obs_normalization: bool = False      # legged_gym scales terms by hand (the layout) instead
    learning_rate: float = 1e-3
    schedule: str = "adaptive"
    desired_kl: float = 0.01
    num_learning_epochs: int = 5
    num_mini_batches: int = 4
    clip_param: float = 0.2
    gamma: float = 0.99
    lam: float = 0.95
    entropy_coef: float = 0.01
    value_loss_coef: float = 1.0
    max_grad_norm: float = 1.0
    use_clipped_value_loss: bool = True
    save_interval: int = 50

    def validate(self) -> "PPOPreset":
        positive = ("num_envs", "num_steps_per_env", "num_learning_epochs", "num_mini_batches", "save_interval")
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; allowed: an integer >= 1")
        for name in ("actor_hidden_dims", "critic_hidden_dims"):
            dims = getattr(self, name)
            if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
                raise ValueError(f"{name}={dims!r} is invalid; allowed: a non-empty list of positive integers")
        if self.schedule not in ("adaptive", "fixed"):
            raise ValueError(f"schedule={self.schedule!r} is invalid; allowed: 'adaptive', 'fixed'")
        if self.activation not in ("elu", "relu", "tanh", "selu", "lrelu", "sigmoid", "softplus", "gelu", "swish", "mish"):
            raise ValueError(f"activation={self.activation!r} is invalid; allowed: elu, relu, tanh, selu, gelu, ...")
        for name in ("learning_rate", "init_noise_std", "clip_param", "desired_kl", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; allowed: > 0")
        for name in ("gamma", "lam"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; allowed: in (0, 1]")
        return self


PRESETS: dict[str, PPOPreset] = {
    "legged_gym": PPOPreset(),
    "cpu": PPOPreset(num_envs=256, actor_hidden_dims=(256, 128, 64), critic_hidden_dims=(256, 128, 64),
                     save_interval=50),
}


def get_preset(name: str) -> PPOPreset:
    if name not in PRESETS:
        raise ValueError(f"--preset={name!r} is invalid; allowed: {sorted(PRESETS)}")
    return PRESETS[name]


def rsl_rl_train_cfg(p: PPOPreset) -> dict[str, Any]:
    """The rsl_rl 5.5 runner config for a preset (class names resolved by rsl_rl itself)."""
    mlp = {"class_name": "rsl_rl.models.MLPModel", "activation": p.activation,
           "obs_normalization": p.obs_normalization}
    return {
        "num_steps_per_env": p.num_steps_per_env,
        "save_interval": p.save_interval,
        "obs_groups": {"actor": ["policy"], "critic": ["critic"]},
        "logger": "tensorboard",
        "actor": {**mlp, "hidden_dims": list(p.actor_hidden_dims),
                  "distribution_cfg": {"class_name": "rsl_rl.modules.GaussianDistribution",
                                       "init_std": p.init_noise_std}},
        "critic": {**mlp, "hidden_dims": list(p.critic_hidden_dims)},
        "algorithm": {"class_name": "rsl_rl.algorithms.PPO", "num_learning_epochs": p.num_learning_epochs,
                      "num_mini_batches": p.num_mini_batches, "clip_param": p.clip_param, "gamma": p.gamma,
                      "lam": p.lam, "value_loss_coef": p.value_loss_coef, "entropy_coef": p.entropy_coef,
                      "learning_rate": p.learning_rate, "max_grad_norm": p.max_grad_norm,
                      "use_clipped_value_loss": p.use_clipped_value_loss, "schedule": p.schedule,
                      "desired_kl": p.desired_kl},
    }


# --- key=value overrides (the one typed setter of quadforge.overrides) ---------------------------------
def apply_preset_overrides(preset: PPOPreset, overrides: dict[str, Any]) -> PPOPreset:
    """The preset with every key that is not ``env.*`` set (typed), validated."""
    return apply_overrides(preset, {k: v for k, v in overrides.items() if not k.startswith("env.")}).validate()


def apply_env_overrides(env_cfg: Any, overrides: dict[str, Any]) -> Any:
    """Set the ``env.a.b.c=value`` keys on the EnvConfig (dict entries by key); unknown paths are errors."""
    return apply_overrides(env_cfg, overrides, root="env")


# --- training -----------------------------------------------------------------------------------------
@dataclass
class TrainExpertConfig:
    out: str
    robot: str = "go1"
    terrain: str = "flat"
    preset: str = "cpu"
    num_envs: int | None = None        # None -> the preset's
    iterations: int = 1000
    resume: str | None = None
    overwrite: bool = False            # allow --out to be a folder that already holds a run
    seed: int = 0
    device: str = "cpu"
    num_threads: int = 1               # MuJoCo + torch threads; the machine is shared
    backend: str = "mujoco_cpu"        # envs.backends name
    warp: WarpConfig | None = None     # mujoco_warp options (None: defaults; on --device cuda the rank's GPU)
    overrides: dict[str, Any] = field(default_factory=dict)


def _runner_class():
    from rsl_rl.runners import OnPolicyRunner

    class QuadforgeRunner(OnPolicyRunner):
        """OnPolicyRunner whose every checkpoint carries what a loader needs to rebuild the policy."""

        quadforge_meta: dict[str, Any] = {}
        purge_step: int | None = None   # a resumed run: TensorBoard drops what the interrupted one logged from here

        def save(self, path: str, infos: dict | None = None) -> None:
            """rsl_rl's save, written whole: beside ``path`` then renamed (a kill mid-write left a truncated
            model_<it>.pt that --resume then picked as the run's latest)."""
            saved = self.alg.save()
            saved["iter"] = self.current_learning_iteration
            saved["infos"] = {**(infos or {}), "quadforge": self.quadforge_meta}
            with file_written_whole(path, "train-expert --out") as partial:
                torch.save(saved, partial)
            self.logger.save_model(path, self.current_learning_iteration)

        def learn(self, *args: Any, **kwargs: Any) -> None:
            if self.purge_step is not None:
                self.logger.init_logging_writer = self._writer_purging(self.logger.init_logging_writer)
            super().learn(*args, **kwargs)

        def _writer_purging(self, init_writer: Any) -> Any:
            """rsl_rl's writer set-up, then (TensorBoard) a writer with ``purge_step``: the steps the
            interrupted run logged past its checkpoint would otherwise show twice, as ``train`` avoids too."""
            def init() -> None:
                init_writer()
                writer = self.logger.writer
                if type(writer).__name__ == "SummaryWriter":
                    from torch.utils.tensorboard import SummaryWriter
                    writer.close()
                    self.logger.writer = SummaryWriter(log_dir=writer.log_dir, flush_secs=10, purge_step=self.purge_step)
            return init

        def _configure_multi_gpu(self) -> None:
            """rsl_rl's torchrun set-up, with the process group opened by ``training.distributed``: nccl
            on CUDA as rsl_rl does, gloo on the CPU (rsl_rl's own insists on nccl and cuda:LOCAL_RANK),
            so the same recipe runs CPU ranks. rsl_rl's PPO broadcasts rank 0's parameters and
            all-reduces the gradients; only rank 0 logs and writes checkpoints."""
            info = init_distributed(str(self.device))
            self.gpu_world_size, self.is_distributed = info.world_size, info.enabled
            self.gpu_local_rank, self.gpu_global_rank = info.local_rank, info.rank
            self.cfg["multi_gpu"] = {"global_rank": info.rank, "local_rank": info.local_rank,
                                     "world_size": info.world_size} if info.enabled else None

    return QuadforgeRunner


def _torchrun_ranks() -> tuple[int, int]:
    """(rank, local rank) under torchrun, (0, 0) in a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 0
    return int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))


def build_env(cfg: TrainExpertConfig, preset: PPOPreset):
    rank, local_rank = _torchrun_ranks()
    warp = cfg.warp
    if cfg.backend == "mujoco_warp" and (warp is None or warp.device is None) and cfg.device.startswith("cuda"):
        # the physics on the GPU this rank trains on
        warp = replace(warp or WarpConfig(), device=f"cuda:{local_rank}")
    # under torchrun every rank simulates envs of its own: a seed of its own (rank 0 keeps cfg.seed)
    return make_env(cfg.robot, cfg.terrain, num_envs=preset.num_envs, seed=cfg.seed + rank,
                    num_threads=cfg.num_threads, backend=cfg.backend, warp=warp,
                    overrides={k[len("env."):]: v for k, v in cfg.overrides.items() if k.startswith("env.")})


def train(cfg: TrainExpertConfig) -> Path:
    """Train; returns the path of the last checkpoint. TensorBoard logs and checkpoints go to ``cfg.out``."""
    if cfg.iterations < 1:
        raise ValueError(f"--iterations={cfg.iterations} is invalid; allowed: an integer >= 1")
    loaded_iteration, meta = check_resume_checkpoint(cfg.resume, cfg.robot) if cfg.resume is not None else (None, {})
    check_expert_out(cfg.out, resume=cfg.resume is not None, overwrite=cfg.overwrite)
    preset = get_preset(cfg.preset)
    if cfg.num_envs is not None:
        preset = replace(preset, num_envs=cfg.num_envs)
    preset = apply_preset_overrides(preset, cfg.overrides).validate()
    if loaded_iteration is not None:
        check_resume_writes(cfg.out, loaded_iteration, cfg.iterations, preset.save_interval)
        check_continues_run(cfg, preset, meta)
    # one training per --out at a time (rank 0 writes the checkpoints): a second run resuming from the
    # first's checkpoints while it writes would replace them under the same names
    with made_folder_removed_on_failure(cfg.out, holds_work=lambda d: any(x.name != RUN_LOCK for x in d.iterdir())):
        lock = acquire(Path(cfg.out) / RUN_LOCK, "train-expert",
                       hint="one training per --out at a time: wait for it to finish, or train into another --out") \
            if int(os.environ.get("RANK", "0")) == 0 else contextlib.nullcontext()
        with lock:
            return _train(cfg, preset)


def _train(cfg: TrainExpertConfig, preset: Any) -> Path:
    torch.set_num_threads(max(1, cfg.num_threads))
    seed_everything(cfg.seed)
    env = build_env(cfg, preset)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    train_cfg = rsl_rl_train_cfg(preset)
    train_cfg["seed"] = cfg.seed
    device = cfg.device
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = f"cuda:{_torchrun_ranks()[1]}"   # what rsl_rl's multi-GPU runner expects
    runner = _runner_class()(env, train_cfg, log_dir=cfg.out, device=device)
    runner.quadforge_meta = {
        "format": 1, "robot": cfg.robot, "terrain": cfg.terrain, "preset": cfg.preset,
        "preset_config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(preset).items()},
        "policy_layout": env.policy_layout.to_dict(), "critic_layout": env.critic_layout.name,
        "action_scale": env.action_scale, "clip_actions": float(env.clip_actions), "dt": env.dt, "seed": cfg.seed,
        "overrides": {k: repr(v) for k, v in cfg.overrides.items()},
        "command": "quadforge train-expert " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "train-expert" else "",
    }
    if cfg.resume:
        runner.load(cfg.resume, map_location=cfg.device)
        # rsl_rl restarts at the loaded index and would save that update again under the loaded name;
        # the checkpoint already holds it, so the continued run starts one later: an uninterrupted run
        # and a resumed one name the same update alike, and the resumed-from file is never rewritten
        runner.current_learning_iteration += 1
        runner.purge_step = runner.current_learning_iteration
        print(f"resumed from {cfg.resume}: continuing at iteration {runner.current_learning_iteration}", flush=True)
    t0 = time.time()
    try:
        # a resumed run's envs are new too: their episode clocks start spread, or every env would time out
        # in the same step once an episode length (legged_gym and Isaac Lab spread them on every start)
        runner.learn(num_learning_iterations=cfg.iterations, init_at_random_ep_len=True)
    finally:
        env.close()
    if runner.is_distributed:   # rank 0 writes the checkpoints: every rank returns the last one
        info = DistInfo(rank=runner.gpu_global_rank, world_size=runner.gpu_world_size)
        barrier(info)
        cleanup(info)
    last = latest_checkpoint(cfg.out)
    print(f"trained {cfg.iterations} iterations in {time.time() - t0:.0f} s; last checkpoint {last}", flush=True)
    return last


def check_resume_checkpoint(path: str, robot: str) -> tuple[int, dict[str, Any]]:
    """``--resume-from`` (or the run's last checkpoint under --resume) must be an rsl_rl 5 PPO checkpoint
    (what train-expert writes) for this robot. Returns the update index it was saved after (``iter``) and
    the run's record (``infos["quadforge"]``: terrain, seed, preset, ...; empty for another writer's)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--resume-from {path!r}: no such checkpoint file")
    try:
        raw = _torch_load(p)
    except ValueError as err:   # damaged: name the run's checkpoint before it, if there is one
        run = rsl_rl_checkpoints(p.parent)
        earlier = run[:run.index(p)] if p in run else []
        if not earlier:
            raise
        raise ValueError(f"{err}; the run's checkpoint before it is {earlier[-1]}: move the damaged file away and "
                         f"continue from that one (--resume-from {earlier[-1]})") from err
    if isinstance(raw, dict) and raw.get("kind") == "quadforge-policy":
        raise ValueError(f"--resume-from {path}: a quadforge train checkpoint (model {raw.get('model', {}).get('name')!r}), "
                         f"not a PPO expert; train-expert --resume-from takes a model_<it>.pt written by train-expert")
    if not isinstance(raw, dict) or "actor_state_dict" not in raw:
        found = sorted(raw)[:6] if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"--resume-from {path}: not an rsl_rl 5 PPO checkpoint (no 'actor_state_dict'; found {found}); "
                         f"train-expert --resume-from takes a model_<it>.pt written by train-expert")
    meta = (raw.get("infos") or {}).get("quadforge") or {}
    trained = meta.get("robot")
    if trained and trained != robot:
        raise ValueError(f"--resume-from {path}: trained for robot {trained!r}, this run is for --robot {robot!r}")
    return int(raw.get("iter", 0)), meta


def written_checkpoints(start: int, iterations: int, save_interval: int) -> list[int]:
    """The ``model_<it>.pt`` indices a run of ``iterations`` updates from index ``start`` saves: every
    index divisible by ``save_interval``, and the last (rsl_rl's ``learn``)."""
    last = start + iterations - 1
    return sorted({it for it in range(start, last + 1) if it % save_interval == 0} | {last})


def check_resume_writes(out: str, loaded_iteration: int, iterations: int, save_interval: int) -> None:
    """A continued run must not replace checkpoints already in ``--out``: resuming from an earlier
    checkpoint of a longer run would write new models under the names of the longer run's."""
    taken = [it for it in written_checkpoints(loaded_iteration + 1, iterations, save_interval)
             if (Path(out) / f"{RSL_RL_PREFIX}{it}.pt").exists()]
    if taken:
        names = ", ".join(f"{RSL_RL_PREFIX}{it}.pt" for it in taken[:4]) + (" ..." if len(taken) > 4 else "")
        raise ValueError(f"--out {out}: continuing from iteration {loaded_iteration} for {iterations} iterations "
                         f"would write {names} over checkpoints already there; resume into a new --out folder "
                         f"(--resume-from PATH --out NEW_DIR) or move those files away first")


# what a continued run (--resume in its own --out) must share with the run it continues: another terrain,
# seed, preset or batch of envs would train on under the first run's name and iteration count
CONTINUES = ("terrain", "seed", "preset", "num_envs")


def check_continues_run(cfg: TrainExpertConfig, preset: Any, meta: dict[str, Any]) -> None:
    """A resume from a checkpoint in ``--out`` continues that run: refused, naming what differs from its
    record ``meta``, when the run was made with other settings (``--resume-from PATH --out NEW`` trains on
    from its weights)."""
    if Path(cfg.resume).resolve().parent != Path(cfg.out).resolve():
        return   # --resume-from into another folder: a new run that starts from those weights
    was = {"terrain": meta.get("terrain"), "seed": meta.get("seed"), "preset": meta.get("preset"),
           "num_envs": (meta.get("preset_config") or {}).get("num_envs")}
    now = {"terrain": cfg.terrain, "seed": cfg.seed, "preset": cfg.preset, "num_envs": preset.num_envs}
    differ = [f"--{k.replace('_', '-')} {was[k]!r} then, {now[k]!r} now" for k in CONTINUES
              if was[k] is not None and was[k] != now[k]]
    if differ:
        raise ValueError(f"--resume {cfg.out}: the run was made with other settings ({'; '.join(differ)}); a resume "
                         f"would not continue it. Start a new run from its weights: --resume-from {cfg.resume} "
                         f"--out NEW_DIR")


def check_expert_out(out: str, resume: bool, overwrite: bool) -> None:
    """A new/empty folder, or one holding a run that --resume continues or --overwrite replaces."""
    p = check_output_dir(out, "PPO expert run", owns=lambda d: any(d.glob(f"{RSL_RL_PREFIX}*.pt"))
                         or any(d.glob("events.out.tfevents*")) or all(x.name == RUN_LOCK for x in d.iterdir()))
    if p.is_dir() and any(p.glob(f"{RSL_RL_PREFIX}*.pt")):
        if not (resume or overwrite):
            raise ValueError(f"--out {out}: already holds a PPO run ({RSL_RL_PREFIX}<it>.pt); pass --resume "
                             f"(or --resume-from PATH) to continue it, --overwrite to replace it, or choose a "
                             f"new folder")


latest_checkpoint = latest_rsl_rl_checkpoint   # the model_<it>.pt with the highest iteration


# --- CLI ----------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_robot(parser)
    parser.add_argument("--terrain", default="flat", help=TERRAIN_SPEC_HELP)
    add_num_envs(parser, None, "parallel envs (default: the preset's)")
    parser.add_argument("--iterations", type=int, default=1000, help="PPO iterations to run")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory: TensorBoard logs and model_<it>.pt")
    parser.add_argument("--resume", nargs="?", const=True, default=None, metavar="",
                        help="continue the run in --out from its highest model_<it>.pt ('--resume PATH' is a "
                             "deprecated spelling of --resume-from PATH)")
    parser.add_argument("--resume-from", default=None, metavar="PATH",
                        help="continue from this rsl_rl checkpoint (model_<it>.pt)")
    parser.add_argument("--overwrite", action="store_true", help="allow --out to be a folder holding a run")
    add_seed(parser)
    parser.add_argument("--preset", default="cpu", help=PRESETS_HELP)
    parser.add_argument("--save-interval", type=int, default=None,
                        help="checkpoint every this many iterations (default: the preset's)")
    parser.add_argument("--device", default="cpu", help="torch device for the networks")
    add_num_threads(parser, 1, "MuJoCo and torch threads (shared machine: 1)")
    add_backend_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="preset fields (learning_rate=3e-4) or env.<EnvConfig path> "
                             "(env.commands.ranges.lin_vel_x=(0.0,1.0))")


def run(args: argparse.Namespace) -> int:
    if isinstance(args.resume, str) and "=" in args.resume and not Path(args.resume).exists():
        # `--resume lr=3e-4`: the optional PATH of the old spelling took the first override; give it back
        args.overrides, args.resume = [args.resume, *args.overrides], True
    if (args.resume or args.resume_from) and args.overwrite:
        raise ValueError("--resume/--resume-from and --overwrite contradict each other; pass one")
    overrides = parse_overrides(args.overrides)
    if args.save_interval is not None:
        overrides["save_interval"] = args.save_interval
    resume = args.resume_from
    if isinstance(args.resume, str):
        print("quadforge: warning: --resume PATH is deprecated; use --resume-from PATH", file=sys.stderr)
        resume = args.resume
    elif args.resume:
        resume = str(latest_checkpoint(args.out))
    cfg = TrainExpertConfig(out=args.out, robot=args.robot, terrain=args.terrain, preset=args.preset,
                            num_envs=args.num_envs, iterations=args.iterations, resume=resume,
                            overwrite=args.overwrite, seed=args.seed, device=args.device, num_threads=args.num_threads,
                            overrides=overrides, **dict(zip(("backend", "warp"), backend_from_args(args))))
    train(cfg)
    return 0
