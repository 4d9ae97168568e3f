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
import dataclasses
import glob
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from quadforge.tools.overrides import parse_overrides  # noqa: F401  (re-exported for callers)

PRESETS_HELP = "legged_gym (the paper's PPO settings, 4096 envs) or cpu (scaled to a 2-core machine)"
CHECKPOINT_PREFIX = "model_"


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


# --- key=value overrides ------------------------------------------------------------------------------
def apply_preset_overrides(preset: PPOPreset, overrides: dict[str, Any]) -> PPOPreset:
    names = {f.name: f for f in fields(PPOPreset)}
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key.startswith("env."):
            continue
        if key not in names:
            raise ValueError(f"override {key!r} is unknown; allowed: {sorted(names)} or env.<EnvConfig path>")
        default = getattr(preset, key)
        if isinstance(default, tuple):
            value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        changes[key] = value
    return replace(preset, **changes).validate()


def apply_env_overrides(env_cfg: Any, overrides: dict[str, Any]) -> None:
    """Set ``env.a.b.c=value`` on the EnvConfig (dict entries by key); unknown paths are errors."""
    for key, value in overrides.items():
        if not key.startswith("env."):
            continue
        parts = key.split(".")[1:]
        target = env_cfg
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            where = "env." + ".".join(parts[:i + 1])
            if isinstance(target, dict):
                if part not in target and not last:
                    raise ValueError(f"override {key!r}: no entry {where}; allowed keys: {sorted(target)}")
                if last:
                    target[part] = tuple(value) if isinstance(value, list) else value
                else:
                    target = target[part]
            else:
                allowed = [f.name for f in fields(target)] if dataclasses.is_dataclass(target) else []
                if part not in allowed:
                    raise ValueError(f"override {key!r}: no field {where}; allowed: {allowed}")
                if last:
                    setattr(target, part, tuple(value) if isinstance(value, list) else value)
                else:
                    target = getattr(target, part)


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
    seed: int = 0
    device: str = "cpu"
    num_threads: int = 1               # MuJoCo + torch threads; the machine is shared
    backend: str = "mujoco_cpu"        # envs.backends name
    warp: Any = None                   # envs.backends.base.WarpConfig for mujoco_warp (None: defaults)
    overrides: dict[str, Any] = field(default_factory=dict)


def _runner_class():
    from rsl_rl.runners import OnPolicyRunner

    class QuadforgeRunner(OnPolicyRunner):
        """OnPolicyRunner whose every checkpoint carries what a loader needs to rebuild the policy."""

        quadforge_meta: dict[str, Any] = {}

        def save(self, path: str, infos: dict | None = None) -> None:
            super().save(path, infos={**(infos or {}), "quadforge": self.quadforge_meta})

        def _configure_multi_gpu(self) -> None:
            """rsl_rl's torchrun set-up, with the process group opened by ``training.distributed``: nccl
            on CUDA as rsl_rl does, gloo on the CPU (rsl_rl's own insists on nccl and cuda:LOCAL_RANK),
            so the same recipe runs CPU ranks. Parameters are broadcast from rank 0 and gradients
            all-reduced by rsl_rl's PPO; only rank 0 logs and writes checkpoints."""
            from quadforge.training.distributed import init_distributed

            info = init_distributed(str(self.device))
            self.gpu_world_size, self.is_distributed = info.world_size, info.enabled
            self.gpu_local_rank, self.gpu_global_rank = info.local_rank, info.rank
            self.cfg["multi_gpu"] = {"global_rank": info.rank, "local_rank": info.local_rank,
                                     "world_size": info.world_size} if info.enabled else None

    return QuadforgeRunner


def build_env(cfg: TrainExpertConfig, preset: PPOPreset):
    from quadforge.collection.collect import terrain_config  # the one parser of flat | mixed | <types>
    from quadforge.envs.config import EnvConfig
    from quadforge.envs.vec_env import LeggedEnv

    # under torchrun each rank simulates its own envs: a seed of its own (rank 0 keeps cfg.seed)
    rank = int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    env_cfg = EnvConfig.flat(robot=cfg.robot, num_envs=preset.num_envs, seed=cfg.seed + rank)
    env_cfg.terrain = terrain_config(cfg.terrain)
    env_cfg.backend.num_threads = cfg.num_threads
    env_cfg.backend_name = cfg.backend
    if cfg.warp is not None:
        env_cfg.backend.warp = cfg.warp
    if cfg.backend == "mujoco_warp" and env_cfg.backend.warp.device is None and cfg.device.startswith("cuda"):
        # the physics on the GPU the rank trains on (torchrun: cuda:LOCAL_RANK)
        local = int(os.environ.get("LOCAL_RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
        env_cfg.backend.warp = replace(env_cfg.backend.warp, device=f"cuda:{local}")
    apply_env_overrides(env_cfg, cfg.overrides)
    return LeggedEnv(env_cfg)


def train(cfg: TrainExpertConfig) -> Path:
    """Train; returns the path of the last checkpoint. TensorBoard logs and checkpoints go to ``cfg.out``."""
    import torch

    from quadforge.envs.vec_env import RslRlLogView
    from quadforge.tools.seeding import seed_everything

    if cfg.iterations < 1:
        raise ValueError(f"--iterations={cfg.iterations} is invalid; allowed: an integer >= 1")
    if cfg.resume is not None and not Path(cfg.resume).is_file():
        raise FileNotFoundError(f"--resume {cfg.resume!r}: no such checkpoint file")
    preset = get_preset(cfg.preset)
    if cfg.num_envs is not None:
        preset = replace(preset, num_envs=cfg.num_envs)
    preset = apply_preset_overrides(preset, cfg.overrides).validate()

    torch.set_num_threads(max(1, cfg.num_threads))
    seed_everything(cfg.seed)
    env = build_env(cfg, preset)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    train_cfg = rsl_rl_train_cfg(preset)
    train_cfg["seed"] = cfg.seed
    device = cfg.device
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"   # what rsl_rl's multi-GPU runner expects
    runner = _runner_class()(RslRlLogView(env), train_cfg, log_dir=cfg.out, device=device)
    runner.quadforge_meta = {
        "format": 1, "robot": cfg.robot, "terrain": cfg.terrain, "preset": cfg.preset,
        "preset_config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(preset).items()},
        "policy_layout": env.policy_layout.to_dict(), "critic_layout": env.critic_layout.name,
        "action_scale": env.action_scale, "dt": env.dt, "seed": cfg.seed,
        "overrides": {k: repr(v) for k, v in cfg.overrides.items()},
        "command": "quadforge train-expert " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "train-expert" else "",
    }
    if cfg.resume:
        runner.load(cfg.resume, map_location=cfg.device)
        print(f"resumed from {cfg.resume} at iteration {runner.current_learning_iteration}", flush=True)
    t0 = time.time()
    try:
        runner.learn(num_learning_iterations=cfg.iterations, init_at_random_ep_len=cfg.resume is None)
    finally:
        env.close()
    if runner.is_distributed:   # rank 0 writes the checkpoints: every rank returns the last one
        from quadforge.training.distributed import DistInfo, barrier, cleanup
        info = DistInfo(rank=runner.gpu_global_rank, world_size=runner.gpu_world_size)
        barrier(info)
        cleanup(info)
    last = latest_checkpoint(cfg.out)
    print(f"trained {cfg.iterations} iterations in {time.time() - t0:.0f} s; last checkpoint {last}", flush=True)
    return last


def latest_checkpoint(directory: str | os.PathLike) -> Path:
    """The ``model_<it>.pt`` with the highest iteration in a run directory."""
    paths = glob.glob(os.path.join(directory, f"{CHECKPOINT_PREFIX}*.pt"))
    if not paths:
        raise FileNotFoundError(f"no {CHECKPOINT_PREFIX}<iteration>.pt checkpoint in {directory}")
    return Path(max(paths, key=lambda p: int(Path(p).stem[len(CHECKPOINT_PREFIX):])))


# --- CLI ----------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--robot", default="go1", help="go1 or aliengo")
    parser.add_argument("--terrain", default="flat", help="flat, mixed, or a comma list of terrain types")
    parser.add_argument("--num-envs", type=int, default=None, help="parallel envs (default: the preset's)")
    parser.add_argument("--iterations", type=int, default=1000, help="PPO iterations to run")
    parser.add_argument("--out", required=True, help="run directory: TensorBoard logs and model_<it>.pt")
    parser.add_argument("--resume", default=None, help="continue from this rsl_rl checkpoint (model_<it>.pt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="cpu", help=PRESETS_HELP)
    parser.add_argument("--save-interval", type=int, default=None,
                        help="checkpoint every this many iterations (default: the preset's)")
    parser.add_argument("--device", default="cpu", help="torch device for the networks")
    parser.add_argument("--num-threads", type=int, default=1, help="MuJoCo and torch threads (shared machine: 1)")
    from quadforge.envs.backends import add_backend_arguments
    add_backend_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="preset fields (learning_rate=3e-4) or env.<EnvConfig path> "
                             "(env.commands.ranges.lin_vel_x=(0.0,1.0))")


def run(args: argparse.Namespace) -> int:
    from quadforge.envs.backends import backend_from_args
    overrides = parse_overrides(args.overrides)
    backend, warp = backend_from_args(args)
    if args.save_interval is not None:
        overrides["save_interval"] = args.save_interval
    cfg = TrainExpertConfig(out=args.out, robot=args.robot, terrain=args.terrain, preset=args.preset,
                            num_envs=args.num_envs, iterations=args.iterations, resume=args.resume,
                            seed=args.seed, device=args.device, num_threads=args.num_threads,
                            backend=backend, warp=warp,
                            overrides=overrides)
    train(cfg)
    return 0
