"""The out-of-core sampler path (memory-mapped shards) against the RAM path, on small stores."""
import json
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import quadforge.data.shard_steps as shard_steps
import quadforge.data.step_shards as shards_mod
from quadforge.data.compaction import compact
from quadforge.data.ram_budget import parse_ram_budget, sampler_source
from quadforge.data.samplers import EpisodeArrays, TransitionSampler, WindowSampler
from quadforge.data.step_shards import StepShards
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_info
from quadforge.layout import get_layout

torch.set_num_threads(1)
LAYOUT = get_layout("proprio")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A 20-episode store with chunks of a few steps, written once for the module."""
    import quadforge.data.compaction as c
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    from quadforge.data.writer import StagingWriter
    root = tmp_path_factory.mktemp("ooc") / "store"
    rng = np.random.default_rng(4)
    with pytest.MonkeyPatch.context() as mp_, StagingWriter(root, "c0") as w:
        mp_.setattr(c, "TARGET_CHUNK_BYTES", 256)
        for i in range(20):
            w.write_episode(synthetic_episode(rng, int(rng.integers(5, 40)), i % 3 != 2), synthetic_info(i, i % 3 != 2))
        compact(root)
    return root


@pytest.fixture
def store(pristine, tmp_path, monkeypatch):
    """A copy of the pristine store (tests damage it); shard chunks and passes of a few steps, so they
    cross episode and chunk boundaries."""
    import shutil
    monkeypatch.setattr(shards_mod, "PASS_BLOCK_STEPS", 64)
    monkeypatch.setattr(shards_mod, "SHARD_CHUNK_BYTES", 1024)
    monkeypatch.setattr(shard_steps, "MOMENT_BLOCK_STEPS", 50)
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    return TrajectoryStore.open(root)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("layout_mode", ["strided", "rows"])
def test_window_batches_split_and_moments_match_the_ram_path(store, layout_mode, monkeypatch):
    import quadforge.data.samplers as samplers
    monkeypatch.setattr(samplers, "WINDOW_LAYOUT", layout_mode)
    for split in ("train", "val"):
        kw = dict(layout=LAYOUT, context=8, split=split, val_fraction=0.25, seed=5)
        ram, ooc = WindowSampler(store, **kw), WindowSampler(StepShards(store), **kw)
        assert np.array_equal(ram.episode_indices, ooc.episode_indices)          # the same split
        assert ram.num_windows == ooc.num_windows
        for _ in range(3):                                                       # the same seeded batches
            _same(ram.sample(32), ooc.sample(32))
        _same(ram.batch_at(np.arange(ram.num_windows)), ooc.batch_at(np.arange(ooc.num_windows)))
        for a, b in ((ram.obs_stats(), ooc.obs_stats()), (ram.action_stats(), ooc.action_stats())):
            for x, y in zip(a, b):
                assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reward,ratio,n_step", [("sparse", 0.75, 1), ("dense", None, 3), ("sparse", 0.5, 2)])
def test_transition_batches_and_success_ratio_match_the_ram_path(store, reward, ratio, n_step):
    for rank in (0, 1):
        kw = dict(layout=LAYOUT, context=4, reward=reward, success_ratio=ratio, n_step=n_step, seed=2,
                  split="train", val_fraction=0.2, rank=rank, world_size=2, gamma=0.9)
        ram, ooc = TransitionSampler(store, **kw), TransitionSampler(StepShards(store), **kw)
        assert len(ram) == len(ooc)
        for _ in range(3):
            a, b = ram.sample(64), ooc.sample(64)
            _same(a, b)
            if ratio is not None:   # the per-batch success ratio holds on both
                assert float(b["success"].mean()) == pytest.approx(round(64 * ratio) / 64)


def test_a_budget_smaller_than_the_store_selects_the_out_of_core_path(store):
    lines = []
    features = list(LAYOUT.term_names) + ["actions"]
    small = sampler_source(store, features, LAYOUT, ram_budget="1K", log=lines.append)
    assert isinstance(small, StepShards) and "out-of-core path" in lines[-1]
    big = sampler_source(store, features, LAYOUT, ram_budget="1G", log=lines.append)
    assert isinstance(big, EpisodeArrays) and "RAM path" in lines[-1]
    assert parse_ram_budget("1.5G") == 1.5 * 2**30 and parse_ram_budget("inf") == float("inf")
    assert parse_ram_budget("auto") > 0
    with pytest.raises(ValueError, match="--ram-budget 'lots'"):
        parse_ram_budget("lots")


def _flip_a_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_store_chunk_is_an_error_naming_store_and_chunk(store):
    chunk = store.root / "data" / "dof_pos" / "c" / "3" / "0"
    _flip_a_byte(chunk, len(chunk.read_bytes()) // 2)
    with pytest.raises(ValueError, match=rf"{store.root}: feature 'dof_pos' chunk 3 .*unreadable"):
        WindowSampler(StepShards(store), LAYOUT, context=4, split="all")


def test_a_damaged_shard_chunk_is_an_error_naming_store_and_chunk(store):
    s = WindowSampler(StepShards(store), LAYOUT, context=4, split="all", reward_feature=None)
    path = s.steps.obs.path
    record = json.loads(path.with_name(path.name + ".json").read_text())
    row_bytes = 4 * LAYOUT.dim
    header = path.stat().st_size - row_bytes * len(s.steps.obs)
    _flip_a_byte(path, header + row_bytes * record["chunk"] * 2 + 5)     # a byte of shard chunk 2
    fresh = WindowSampler(StepShards(store), LAYOUT, context=4, split="all", reward_feature=None)
    with pytest.raises(ValueError, match=rf"{store.root}: out-of-core shard obs@proprio-\w+\.npy chunk 2 "):
        fresh.batch_at(np.arange(fresh.num_windows))


def _rank(root: str, rank: int, queue) -> None:
    torch.set_num_threads(1)
    s = TransitionSampler(StepShards(TrajectoryStore.open(root)), LAYOUT, context=4, split="all", rank=rank,
                          world_size=2)
    for _ in range(5):
        s.sample(16)
    maps = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(".npy") and parts[5].startswith(f"{root}/shards/"):
                maps.add((parts[1], parts[3], int(parts[4]), parts[5]))     # perms, device, inode, path
    queue.put((rank, sorted(maps)))


def test_two_ranks_on_one_node_map_one_copy(store):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(str(store.root), r, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0] and got[0] == got[1]                          # the same files (device, inode), both ranks
    assert all(perms.startswith("r--s") for perms, *_ in got[0])  # read-only, shared: no private copy
    files = sorted(p.name for p in (store.root / "shards").rglob("*.npy"))
    assert len(files) == len({f for _, _, _, f in got[0]})       # each shard written once, by one rank


def test_imitation_trains_the_same_weights_on_either_path(store, tmp_path, capsys):
    """A budget below the store's size takes the out-of-core path (said in the log) and trains the same
    weights from the same seed as the RAM path."""
    from quadforge.training.imitation import train
    from quadforge.training.presets import preset

    def run(budget: str, out: str):
        cfg = preset("fcnet", "cpu")
        cfg.max_steps, cfg.batch_size, cfg.log_every, cfg.val_every, cfg.val_batches = 6, 16, 3, 3, 1
        cfg.context, cfg.ram_budget, cfg.tensorboard = 4, budget, False
        cfg.model_config = dict(modes=2, hidden=16, num_layers=1, decoder_hidden=16)
        return train(cfg, str(store.root), tmp_path / out).model.state_dict()

    ram = run("inf", "ram")
    assert "data: RAM path" in capsys.readouterr().out
    ooc = run("1K", "ooc")
    assert "data: out-of-core path" in capsys.readouterr().out
    assert all(torch.equal(ram[k], ooc[k]) for k in ram)


def test_image_sampler_reads_step_features_from_shards_alike(tmp_path):
    from quadforge.data.image_sampler import ImageWindowSampler
    from quadforge.data.synthetic import synthetic_image_episode, synthetic_task_params
    from quadforge.data.writer import StagingWriter
    rng = np.random.default_rng(0)
    with StagingWriter(tmp_path / "images", "c") as w:
        for e in range(8):
            f = synthetic_image_episode(rng, int(rng.integers(4, 30)), e % 4 != 3, stride=3, size=4)
            w.write_episode(f, {**synthetic_info(e, e % 4 != 3), "task_params": synthetic_task_params(e),
                                "frame_stride": 3, "instruction": "go left", "instructions": {"0": "go left"}})
    compact(tmp_path / "images")
    image_store = TrajectoryStore.open(tmp_path / "images")
    kw = dict(history=3, split="train", val_fraction=0.25, success_ratio=0.75, seed=1, cache_chunks=4)
    ram = ImageWindowSampler(image_store, **kw)
    ooc = ImageWindowSampler(image_store, steps=StepShards(image_store), **kw)
    for _ in range(3):
        _same(ram.sample(16), ooc.sample(16))
    ram.reseed("segment/1"), ooc.reseed("segment/1")    # the public rng API: the same named stream on both
    _same(ram.sample(8), ooc.sample(8))
    assert ram.rng.bit_generator.state == ooc.rng.bit_generator.state
