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
from quadforge.data.store_set import MultiStepShards, StoreSet, concat_episodes
from quadforge.data.synthetic import synthetic_info
from quadforge.layout import get_layout

torch.set_num_threads(1)
LAYOUT = get_layout("proprio")


def _small_store(root: Path, episodes: int, seed: int) -> Path:
    """A store of short episodes (one in three failed) with chunks of a few steps."""
    import quadforge.data.compaction as c
    from quadforge.data.synthetic import synthetic_episode
    from quadforge.data.writer import StagingWriter
    rng = np.random.default_rng(seed)
    with pytest.MonkeyPatch.context() as mp_, StagingWriter(root, "c0") as w:
        mp_.setattr(c, "TARGET_CHUNK_BYTES", 256)
        for i in range(episodes):
            w.write_episode(synthetic_episode(rng, int(rng.integers(5, 40)), i % 3 != 2), synthetic_info(i, i % 3 != 2))
        compact(root)
    return root


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A 20-episode store, written once for the module."""
    return _small_store(tmp_path_factory.mktemp("ooc") / "store", 20, seed=4)


@pytest.fixture(scope="module")
def pristine_second(tmp_path_factory):
    """A second, 9-episode store (DAgger's relabelled store beside the expert's)."""
    return _small_store(tmp_path_factory.mktemp("ooc2") / "relabelled", 9, seed=7)


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


@pytest.fixture
def aggregate(store, pristine_second, tmp_path):
    """The two stores as one (a copy of the second too: tests damage it)."""
    import shutil
    root = tmp_path / "relabelled"
    shutil.copytree(pristine_second, root)
    return StoreSet.open([store.root, root])


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


def test_action_bins_are_fitted_on_the_selected_steps_alike_on_either_path(store):
    """GeRM fits its bins on ``binning_actions``: the selected steps' actions on both paths, never the RAM
    table's zero rows (the windows' padding), so quantile bins are the same whichever path a run takes."""
    from quadforge.models.binning import fit_binner
    kw = dict(layout=LAYOUT, context=4, seed=2, split="train", val_fraction=0.2)
    ram, ooc = TransitionSampler(store, **kw), TransitionSampler(StepShards(store), **kw)
    a, b = ram.binning_actions(), ooc.binning_actions()
    assert a.shape == b.shape == (ram.steps.num_steps, 12) and np.array_equal(a, b)
    assert not (a == 0).all(axis=1).any()          # no padding row among them
    for method in ("uniform", "quantile"):
        assert torch.equal(fit_binner(a, 16, method).edges, fit_binner(b, 16, method).edges), method

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


# --- several stores as one (DAgger's aggregate) -----------------------------------------------------------

def test_an_aggregate_reads_alike_on_both_paths_and_as_its_stores_concatenated(aggregate):
    """The aggregate out of core (each store's shards, joined per batch) draws the same batches, split,
    moments and per-batch success ratio as the RAM path, which equals the stores loaded and concatenated."""
    features = list(LAYOUT.term_names) + ["actions", "rewards", "terminated"]
    ram = EpisodeArrays.from_store(aggregate, features)
    cat = concat_episodes([EpisodeArrays.from_store(s, features) for s in aggregate.stores])
    assert all(np.array_equal(ram.features[k], cat.features[k]) for k in features)
    assert np.array_equal(ram.episode_ends, cat.episode_ends) and ram.episode_ends[-1] == aggregate.num_steps
    assert np.array_equal(ram.episode_info["success"], cat.episode_info["success"])
    ooc = MultiStepShards(aggregate)
    assert np.array_equal(ooc.episode_ends, ram.episode_ends)
    for split in ("train", "val"):   # context 8: windows of the second store's first steps reach back into the first
        kw = dict(layout=LAYOUT, context=8, split=split, val_fraction=0.25, seed=5)
        a, b = WindowSampler(ram, **kw), WindowSampler(ooc, **kw)
        assert np.array_equal(a.episode_indices, b.episode_indices)
        if split == "train":                                                      # both stores in the split
            assert (a.episode_indices >= aggregate.stores[0].num_episodes).any()
        for _ in range(3):
            _same(a.sample(32), b.sample(32))
        _same(a.batch_at(np.arange(a.num_windows)), b.batch_at(np.arange(b.num_windows)))
        for x, y in zip(a.obs_stats() + a.action_stats(), b.obs_stats() + b.action_stats()):
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)
    for rank in (0, 1):
        kw = dict(layout=LAYOUT, context=4, reward="sparse", success_ratio=0.75, n_step=2, seed=2, gamma=0.9,
                  split="train", val_fraction=0.2, rank=rank, world_size=2)
        a, b = TransitionSampler(ram, **kw), TransitionSampler(ooc, **kw)
        assert len(a) == len(b)
        for _ in range(3):
            x, y = a.sample(64), b.sample(64)
            _same(x, y)
            assert float(y["success"].mean()) == pytest.approx(round(64 * 0.75) / 64)


def test_a_budget_smaller_than_the_aggregate_selects_the_out_of_core_path(aggregate):
    lines = []
    features = list(LAYOUT.term_names) + ["actions"]
    small = sampler_source(aggregate, features, LAYOUT, ram_budget="1K", log=lines.append)
    assert isinstance(small, MultiStepShards) and lines[-1].startswith(
        f"data: out-of-core path ({aggregate.num_steps:,} steps x 1 rank(s)")
    assert all(f"{r}/shards" in lines[-1] for r in aggregate.roots)
    big = sampler_source(aggregate, features, LAYOUT, ram_budget="1G", log=lines.append)
    assert isinstance(big, EpisodeArrays) and big.num_steps == aggregate.num_steps and "RAM path" in lines[-1]


def test_a_damaged_chunk_of_one_store_of_an_aggregate_is_an_error_naming_that_store(aggregate):
    second = aggregate.roots[1]
    chunk = second / "data" / "dof_pos" / "c" / "2" / "0"
    _flip_a_byte(chunk, len(chunk.read_bytes()) // 2)
    with pytest.raises(ValueError, match=rf"{second}: feature 'dof_pos' chunk 2 .*unreadable"):
        WindowSampler(MultiStepShards(aggregate), LAYOUT, context=4, split="all")


def test_a_damaged_shard_chunk_of_one_store_of_an_aggregate_is_an_error_naming_that_store(aggregate):
    s = WindowSampler(MultiStepShards(aggregate), LAYOUT, context=4, split="all", reward_feature=None)
    path = s.steps.obs.parts[1].path                                  # the second store's layout shard
    record = json.loads(path.with_name(path.name + ".json").read_text())
    row_bytes = 4 * LAYOUT.dim
    header = path.stat().st_size - row_bytes * len(s.steps.obs.parts[1])
    _flip_a_byte(path, header + row_bytes * record["chunk"] + 3)     # a byte of its shard chunk 1
    fresh = WindowSampler(MultiStepShards(aggregate), LAYOUT, context=4, split="all", reward_feature=None)
    with pytest.raises(ValueError, match=rf"{aggregate.roots[1]}: out-of-core shard obs@proprio-\w+\.npy chunk 1 "):
        fresh.batch_at(np.arange(fresh.num_windows))


def test_an_aggregate_that_cannot_be_joined_is_a_clear_error(aggregate, tmp_path):
    with pytest.raises(FileNotFoundError, match="no trajectory store at .*nowhere"):
        StoreSet.open([aggregate.roots[0], tmp_path / "nowhere"])
    with pytest.raises(ValueError, match=r"WindowSampler: features 'rewards' \(not in .*\) are missing"):
        WindowSampler(MultiStepShards(_without(aggregate, "rewards", tmp_path)), LAYOUT, context=4)


def _without(aggregate: StoreSet, feature: str, tmp_path: Path) -> StoreSet:
    """The aggregate's first store beside a store that lacks ``feature``."""
    from quadforge.data.synthetic import PROPRIO_FEATURES, synthetic_episode
    from quadforge.data.writer import StagingWriter
    root = tmp_path / "no_feature"
    with StagingWriter(root, "c0") as w:
        rng = np.random.default_rng(0)
        for i in range(2):
            w.write_episode(synthetic_episode(rng, 6, True, [f for f in PROPRIO_FEATURES if f != feature]),
                            synthetic_info(i, True))
        compact(root)
    return StoreSet.open([aggregate.roots[0], root])


def test_imitation_on_an_aggregate_trains_the_same_weights_on_either_path(aggregate, tmp_path, capsys):
    """DAgger's training call: a budget below the aggregate takes the out-of-core path (said in the log, as
    for one store) and trains the same weights from the same seed as the RAM path."""
    from quadforge.training.imitation import train
    from quadforge.training.presets import preset

    def run(budget: str, out: str):
        cfg = preset("fcnet", "cpu")
        cfg.max_steps, cfg.batch_size, cfg.log_every, cfg.val_every, cfg.val_batches = 6, 16, 3, 3, 1
        cfg.context, cfg.ram_budget, cfg.tensorboard = 4, budget, False
        cfg.model_config = dict(modes=2, hidden=16, num_layers=1, decoder_hidden=16)
        result = train(cfg, aggregate, tmp_path / out)
        return result.model.state_dict(), torch.load(result.checkpoint, weights_only=True)

    (ram, ram_ck), out = run("inf", "ram"), capsys.readouterr().out
    assert "data: RAM path" in out
    (ooc, ooc_ck), out = run("1K", "ooc"), capsys.readouterr().out
    assert "data: out-of-core path" in out and all(f"{r}/shards" in out for r in aggregate.roots)
    assert all(torch.equal(ram[k], ooc[k]) for k in ram)
    assert ooc_ck["provenance"]["store"] == [str(r.resolve()) for r in aggregate.roots]
    assert ooc_ck["provenance"]["episodes"] == aggregate.num_episodes == 29


def test_a_return_conditioned_model_trains_alike_on_either_path_with_the_best_return_as_target(store, tmp_path):
    """Return-to-go out of core: the same weights as the RAM path, and the deployment target is the best
    training episode's return (the return to go at its first step) on both."""
    from quadforge.training.imitation import train
    from quadforge.training.presets import preset

    def run(budget: str, out: str):
        cfg = preset("transformer", "cpu")
        cfg.max_steps, cfg.batch_size, cfg.log_every, cfg.val_every, cfg.val_batches = 3, 16, 3, 3, 1
        cfg.context, cfg.ram_budget, cfg.tensorboard = 4, budget, False
        cfg.model_config.update(use_rtg=True, use_actions=True)
        result = train(cfg, str(store.root), tmp_path / out)
        return result.model.state_dict(), torch.load(result.checkpoint, weights_only=True)

    (ram, ram_ck), (ooc, ooc_ck) = run("inf", "ram"), run("0", "ooc")
    assert all(torch.equal(ram[k], ooc[k]) for k in ram)
    train_eps = WindowSampler(store, LAYOUT, context=4, split="train", seed=0).episode_indices
    rewards = store.load(["rewards"])["rewards"].astype(np.float64).reshape(-1)
    ends = store.episode_ends
    best = max(rewards[(ends[e - 1] if e else 0):ends[e]].sum() for e in train_eps)
    scale = ram_ck["train_config"]["rtg_scale"]
    assert ram_ck["extra"]["target_return"] == ooc_ck["extra"]["target_return"]
    assert ram_ck["extra"]["target_return"] == pytest.approx(best / scale, rel=1e-5)


def test_joined_shards_read_rows_blocks_and_windows_across_the_store_boundary(aggregate):
    table = MultiStepShards(aggregate).layout_table(LAYOUT)
    whole = np.concatenate([p.block(0, len(p)) for p in table.parts])
    boundary, n = int(table.offsets[1]), 8
    assert len(table) == len(whole) == aggregate.num_steps
    np.testing.assert_array_equal(table.block(boundary - 30, boundary + 20), whole[boundary - 30:boundary + 20])
    rows = np.array([[0, boundary - 1], [boundary, len(whole) - 1]])
    np.testing.assert_array_equal(table.take(rows), whole[rows])
    for starts in (np.arange(boundary - n - 2, boundary + 3), np.array([boundary + 1, boundary + 5]),
                   np.array([3, boundary - n])):   # mixed and crossing; all in the second store; all in the first
        idx = starts[:, None] + np.arange(n)[None, :]
        first = table.offsets[np.searchsorted(table.offsets, idx[:, -1], side="right") - 1]
        want = whole[np.maximum(idx, first[:, None])]     # rows before a window's store read its first row
        np.testing.assert_array_equal(table.windows(starts, n, span=idx[:, -1]), want)


def test_a_store_view_deletes_only_older_generations_shards(tmp_path):
    """A reader that opened the store before a compaction must not delete the newer generation's
    shards (a trainer on the new view may be writing them); a newer view deletes the older ones."""
    root = tmp_path / "shards"
    for g in (3, 7, 12):
        (root / f"g{g}").mkdir(parents=True)
        (root / f"g{g}" / "x.npy").write_bytes(b"0")
    (root / "notes").mkdir()
    shards_mod._drop_old_generations(root / "g7")
    assert sorted(p.name for p in root.iterdir()) == ["g12", "g7", "notes"]
    shards_mod._drop_old_generations(root / "g12")
    assert sorted(p.name for p in root.iterdir()) == ["g12", "notes"]
