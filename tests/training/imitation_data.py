"""A small learnable dataset for the imitation tests: actions are a fixed function of the last two
steps' joint positions, so a model with history can fit them and the loss must fall."""
import numpy as np

from quadforge.data.episodes import EpisodeArrays
from quadforge.layout import TERM_DIMS, get_layout


def learnable_arrays(num_episodes: int = 12, seed: int = 0) -> EpisodeArrays:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(15, 40, size=num_episodes)
    steps = int(lengths.sum())
    feats = {n: rng.normal(size=(steps, TERM_DIMS[n])).astype(np.float32) for n in get_layout("proprio").term_names}
    w = rng.normal(size=(12, 12)).astype(np.float32) / 4
    prev = np.roll(feats["dof_pos"], 1, axis=0)
    feats["actions"] = np.tanh(feats["dof_pos"] @ w + 0.5 * prev @ w).astype(np.float32)
    feats["rewards"] = rng.uniform(size=steps).astype(np.float32)
    info = {"success": (np.arange(num_episodes) % 4 != 0)}
    return EpisodeArrays(feats, np.cumsum(lengths), info)


def ddp_worker(rank: int, world_size: int, port: int, out_dir: str, cfg_dict: dict) -> None:
    """One torchrun-like rank: the same entry point as `quadforge train`, then dump its weights."""
    import os

    import torch

    from quadforge.training.imitation import train
    from quadforge.training.presets import TrainConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    result = train(TrainConfig.from_dict(cfg_dict), learnable_arrays(), out_dir)
    torch.save({k: v.clone() for k, v in result.model.state_dict().items()}, f"{out_dir}/rank{rank}.pt")
