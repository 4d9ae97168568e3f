"""The image-window sampler: window contents, the frame <-> step mapping, chunk cache, mixing, determinism."""
import numpy as np
import pytest
import torch

from quadforge.data.image_sampler import ChunkCache, ImageWindowSampler, prefetch
from quadforge.data.writer import StagingWriter
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_image_episode, synthetic_info, synthetic_task_params
from quadforge.envs.quard.families import family_names

STRIDE = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """12 episodes (every 4th a failure), frames every 3 steps, 4 frames per image chunk. Pixel (0, 0) of
    every frame holds (episode, frame j); hl_commands[:, 0] the step within the episode, [:, 1] the episode.
    Built once for the module (samplers only read it)."""
    import quadforge.data.images as images
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(images, "IMAGE_CHUNK_BYTES", 1)
        mp.setattr(images, "MIN_IMAGE_CHUNK_FRAMES", 4)
        return _build(tmp_path_factory.mktemp("images") / "s")


def _build(root):
    rng = np.random.default_rng(0)
    w = StagingWriter(root, "c")
    for e in range(12):
        length = int(rng.integers(4, 30))
        success = e % 4 != 3
        f = synthetic_image_episode(rng, length, success, stride=STRIDE, size=4, depth=True, instruction_index=e % 2)
        f["images/front_rgb"][:, 0, 0, 0] = e
        f["images/front_rgb"][:, 0, 0, 1] = np.arange(len(f["images/front_rgb"]))
        f["hl_commands"][:, 0] = np.arange(length)
        f["hl_commands"][:, 1] = e
        f["rewards"][:] = 1.0
        params = synthetic_task_params(e, families=family_names())
        w.write_episode(f, {**synthetic_info(e, success), "task_params": params, "frame_stride": STRIDE,
                            "instruction": ["go left", "go right"][e % 2],
                            "instructions": {str(e % 2): ["go left", "go right"][e % 2]}})
    compact(root)
    return TrajectoryStore.open(root)


def test_windows_hold_the_right_frames_commands_and_flags(store):
    s = ImageWindowSampler(store, history=4, split="all", cache_chunks=2)
    lengths = store.episodes["length"]
    assert s.num_windows == int(np.sum(-(-lengths // STRIDE)))
    b = s.batch_at(np.arange(s.num_windows))
    ep, j = b["episode_index"].numpy(), b["frame"].numpy()
    rgb = b["images/front_rgb"].numpy()
    assert rgb.shape == (s.num_windows, 4, 4, 4, 3) and b["images/front_depth"].shape == (s.num_windows, 4, 4, 4)
    for i in range(s.num_windows):
        e, jj = ep[i], j[i]
        for h in range(4):
            k = jj - 3 + h
            if k < 0:
                assert not b["mask"][i, h] and (rgb[i, h] == 0).all() and (b["actions"][i, h] == 0).all()
            else:
                assert b["mask"][i, h] and tuple(rgb[i, h, 0, 0, :2]) == (e, k)
                # the command at the frame's step: frame k = step k * stride
                assert b["actions"][i, h, 0] == k * STRIDE and b["actions"][i, h, 1] == e
        n_frames = -(-lengths[e] // STRIDE)
        assert bool(b["next_valid"][i]) == (jj + 1 < n_frames) and bool(b["last"][i]) == (jj + 1 == n_frames)
        if jj + 1 < n_frames:
            assert tuple(b["next_images/front_rgb"][i, 0, 0, :2].tolist()) == (e, jj + 1)
        else:
            assert (b["next_images/front_rgb"][i] == 0).all()
        # rewards (all 1) summed over the frame's decision interval, cut at the episode's end
        assert b["reward"][i] == min(STRIDE, lengths[e] - jj * STRIDE)
        assert b["step"][i] == jj * STRIDE
        success = store.episodes["success"][e]
        assert b["sparse_reward"][i] == float(success and jj + 1 == n_frames)
        assert b["done"][i] == float((not success) and jj + 1 == n_frames)   # failures end by a termination
        assert s.instructions[int(b["instruction"][i])] == ["go left", "go right"][e % 2]
    assert s.caches["images/front_rgb"].misses > 0


def test_chunk_cache_reads_each_chunk_once_per_gather(store):
    arr = store.array("images/front_rgb")
    n = store.manifest["lengths"]["images/front_rgb"]
    cache = ChunkCache(arr, n, capacity=3)
    everything = np.asarray(arr[:n])
    rows = np.random.default_rng(0).integers(0, n, 50)
    np.testing.assert_array_equal(cache.gather(rows), everything[rows])
    assert cache.misses == len(np.unique(rows // cache.chunk)) and len(cache._chunks) == 3
    with pytest.raises(ValueError, match="capacity=0"):
        ChunkCache(arr, n, capacity=0)
    # every decoded chunk is checked against the manifest's CRC32C of its rows
    crcs = list(store.manifest["checksums"]["images/front_rgb"])
    assert len(crcs) == -(-n // cache.chunk)
    np.testing.assert_array_equal(ChunkCache(arr, n, 2, crcs).gather(rows), everything[rows])
    crcs[int(rows[0]) // cache.chunk] ^= 1
    with pytest.raises(ValueError, match=f"chunk {int(rows[0]) // cache.chunk} fails its CRC32C checksum"):
        ChunkCache(arr, n, 2, crcs).gather(rows)


def test_same_seed_same_batches_and_ranks_are_disjoint(store):
    a = ImageWindowSampler(store, split="all", seed=3)
    b = ImageWindowSampler(store, split="all", seed=3)
    c = ImageWindowSampler(store, split="all", seed=4)
    ba, bb, bc = a.sample(32), b.sample(32), c.sample(32)
    for k in ba:
        assert torch.equal(ba[k], bb[k])
    assert not torch.equal(ba["frame"], bc["frame"]) or not torch.equal(ba["episode_index"], bc["episode_index"])
    sa, sb = a.stream(16), b.stream(16)
    for _ in range(3):
        x, y = next(sa), next(sb)
        assert torch.equal(x["images/front_rgb"], y["images/front_rgb"])
    r0 = ImageWindowSampler(store, split="all", rank=0, world_size=2)
    r1 = ImageWindowSampler(store, split="all", rank=1, world_size=2)
    key = lambda s: {(int(e), int(j)) for e, j in zip(s._win_ep, s._win_j)}   # noqa: E731
    assert not key(r0) & key(r1) and len(key(r0) | key(r1)) == a.num_windows
    # 12 episodes' first frames over 13 ranks: the last rank has no early window to draw
    with pytest.raises(ValueError, match="rank 12 of 13 has none"):
        ImageWindowSampler(store, split="all", rank=12, world_size=13, early_frames=1, early_share=0.5)


@pytest.mark.parametrize("mode", ["sample", "stream"])
def test_mixing_ratio_is_honoured(store, mode):
    s = ImageWindowSampler(store, split="all", success_ratio=0.7569, seed=1, cache_chunks=4)
    batches = [s.sample(256) for _ in range(4)] if mode == "sample" else [b for _, b in zip(range(4), s.stream(256))]
    for b in batches:
        # round(256 * 0.7569) = 194 demonstrations, 62 failures in every batch
        assert int(b["success"].sum()) == 194
    only_fail = ImageWindowSampler(store, split="all", filters={"failure_only": True})
    with pytest.raises(ValueError, match="success_ratio=0.5 needs successful episodes"):
        ImageWindowSampler(store, split="all", filters={"failure_only": True}, success_ratio=0.5)
    assert not only_fail.sample(64)["success"].any()


def test_filters_by_family_and_split(store):
    fam = ImageWindowSampler(store, split="all", filters={"families": ["stop", "distinguish"]})
    families = {store.task_params(int(e))["family"] for e in fam.episodes}
    assert families == {"stop", "distinguish"}
    assert set(fam.sample(64)["episode_index"].tolist()) <= set(fam.episodes.tolist())
    # a family the store lacks (or a typo) selects nothing of it: named, not dropped silently
    with pytest.raises(ValueError, match=r"filter families: \['stpo'\] match no episode of the source"):
        ImageWindowSampler(store, split="all", filters={"families": ["stop", "stpo"]})
    train, val = ImageWindowSampler(store), ImageWindowSampler(store, split="val")
    assert not set(train.episodes) & set(val.episodes)


def test_epoch_covers_every_window_once_touching_few_chunks_per_batch(store):
    s = ImageWindowSampler(store, split="all", history=2, cache_chunks=4)
    seen = []
    starts, chunk = store.frame_starts("images/front_rgb"), s.caches["images/front_rgb"].chunk
    for b in s.epoch(8):
        seen += list(zip(b["episode_index"].tolist(), b["frame"].tolist()))
        homes = (starts[b["episode_index"].numpy()] + b["frame"].numpy()) // chunk
        assert len(np.unique(homes)) <= 4      # groups of 2 chunks; a batch spans at most two groups
    assert len(seen) == s.num_windows == len(set(seen))
    again = [(int(e), int(f)) for b in s.epoch(8) for e, f in zip(b["episode_index"], b["frame"])]
    assert again == seen and [x for b in s.epoch(8, epoch=1) for x in b["frame"].tolist()] != [f for _, f in seen]


def test_stream_decodes_fewer_chunks_than_uniform_draws(store):
    u = ImageWindowSampler(store, split="all", history=2, next_frame=False, cache_chunks=4, seed=0)
    k = ImageWindowSampler(store, split="all", history=2, next_frame=False, cache_chunks=4, seed=0)
    for _ in range(10):
        u.sample(16)
    stream = k.stream(16, resident_chunks=2, refresh=1)
    for _ in range(10):
        next(stream)
    assert k.caches["images/front_rgb"].misses < u.caches["images/front_rgb"].misses


def test_prefetch_yields_the_same_batches_in_order(store):
    a = ImageWindowSampler(store, split="all", seed=5)
    b = ImageWindowSampler(store, split="all", seed=5)
    direct, fetched = b.stream(8), prefetch(a.stream(8), depth=2)
    for _ in range(4):
        x, y = next(direct), next(fetched)
        assert torch.equal(x["frame"], y["frame"]) and torch.equal(x["images/front_rgb"], y["images/front_rgb"])
    fetched.close()   # stops the thread

    def broken():
        yield a.sample(2)
        raise OSError("disk gone")
    it = prefetch(broken())
    next(it)
    with pytest.raises(RuntimeError, match="prefetch failed: disk gone"):
        next(it)


def test_clear_errors(tmp_path, store):
    with pytest.raises(ValueError, match="history=0"):
        ImageWindowSampler(store, history=0)
    with pytest.raises(ValueError, match=r"cameras \['images/side'\] not in the store's image features"):
        ImageWindowSampler(store, cameras=["images/side"])
    with pytest.raises(ValueError, match=r"features \['joint_velocity'\] are missing"):
        ImageWindowSampler(store, step_features=["joint_velocity"])
    plain = tmp_path / "plain"
    StagingWriter(plain, "c").write_episode(synthetic_episode(np.random.default_rng(0), 5, True), synthetic_info(0, True))
    compact(plain)
    with pytest.raises(ValueError, match="not in the store's image features"):
        ImageWindowSampler(TrajectoryStore.open(plain))


def test_dataloader_workers_draw_different_reproducible_batches(store):
    from torch.utils.data import DataLoader
    from quadforge.data.image_sampler import ImageWindowDataset
    ds = ImageWindowDataset(store.root, batch_size=8, seed=2, split="all", history=2)
    inline = next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    direct = next(ImageWindowSampler(store, split="all", history=2, seed=2).stream(8))
    assert torch.equal(inline["frame"], direct["frame"]) and torch.equal(inline["images/front_rgb"],
                                                                          direct["images/front_rgb"])


@pytest.mark.slow
def test_dataloader_with_two_worker_processes(store):
    from torch.utils.data import DataLoader
    from quadforge.data.image_sampler import ImageWindowDataset
    ds = ImageWindowDataset(store.root, batch_size=8, seed=2, split="all", history=2)

    def first_four():
        it = iter(DataLoader(ds, batch_size=None, num_workers=2))
        return [next(it) for _ in range(4)]
    a, b = first_four(), first_four()
    for x, y in zip(a, b):                                   # reproducible
        assert torch.equal(x["frame"], y["frame"]) and torch.equal(x["episode_index"], y["episode_index"])
    assert not (torch.equal(a[0]["frame"], a[1]["frame"]) and torch.equal(a[0]["episode_index"], a[1]["episode_index"]))


def test_the_vla_trainer_reads_windows_from_an_image_store(store):
    from quadforge.training.vla_data import check_batch, open_image_source
    src = open_image_source(store.root, history=3, seed=0, split="all", success_ratio=0.75)
    batch = src.sample(16)
    check_batch(batch, 3, (4, 4))
    assert int(batch["success"].sum()) == 12 and src.settings["image_every"] == STRIDE
    assert src.instructions == store.instructions
    with pytest.raises(ValueError, match="no 'images/side' frames"):
        open_image_source(store.root, history=3, camera="images/side")


def test_window_actions_are_the_commands_at_each_windows_newest_frame(store):
    """hl_commands[:, 0] holds the step within the episode and [:, 1] the episode (see the fixture)."""
    from quadforge.models.binning import fit_binner
    from quadforge.training.vla_data import open_image_source
    s = ImageWindowSampler(store, history=3, seed=0)
    acts = s.window_actions()
    assert acts.shape == (s.num_windows, 12)
    for e in np.unique(acts[:, 1]).astype(int):
        steps = np.sort(acts[acts[:, 1] == e, 0])
        assert np.array_equal(steps, np.arange(len(steps)) * STRIDE)     # frame j's command is step j * stride
    src = open_image_source(store.root, history=3, seed=0, split="all")
    commands = src.commands()
    assert torch.equal(commands, torch.from_numpy(src.sampler.window_actions()))
    binner = fit_binner(commands, 16, "uniform")                         # what bins=data fits
    assert binner.edges.shape[0] == commands.shape[1]


@pytest.mark.parametrize("batch_size", [7, 10, 33, 256])
def test_mixing_ratio_within_one_batch_of_a_store_with_both(store, batch_size):
    """GeRM's 75.69 % : 24.31 % on a store whose own window mix differs (every 4th episode failed): every
    batch carries round(B * 0.7569) successful windows (at most half a window from B * 0.7569), each one
    from a successful episode per the store's labels; without a ratio the store's own share comes back
    within 3 binomial standard deviations of one batch."""
    labels = store.episodes["success"]
    s = ImageWindowSampler(store, split="all", success_ratio=0.7569, seed=3)
    for _ in range(5):
        b = s.sample(batch_size)
        k = int(b["success"].sum())
        assert abs(k - batch_size * 0.7569) <= 0.5
        assert b["success"].tolist() == [float(labels[int(e)]) for e in b["episode_index"]]
    natural = ImageWindowSampler(store, split="all", seed=3)
    lengths = store.episodes["length"]
    frames = -(-lengths // STRIDE)
    share = float(frames[labels.astype(bool)].sum() / frames.sum())     # successful windows / all windows
    n = 256
    k = int(natural.sample(n)["success"].sum())
    assert abs(k / n - share) <= 3 * np.sqrt(share * (1 - share) / n)


def test_rewards_and_monte_carlo_bounds_on_image_episodes_match_a_hand_computation(store):
    """Through the VLA trainer's source (training/vla_data.py) on the image store: the sparse reward is 1 on
    a successful episode's last frame only, the Monte-Carlo return success * gamma^(frames to the end) at the
    image rate, and the Q target's lower bound max(Bellman, MC) on the last dimension."""
    from quadforge.models.losses import with_mc_lower_bound
    from quadforge.training.vla_data import StoreImageSource
    gamma = 0.9
    sampler = ImageWindowSampler(store, history=2, split="all", next_frame=True)
    src = StoreImageSource(sampler, store, gamma=gamma)
    raw = sampler.batch_at(np.arange(sampler.num_windows))
    b = src.convert(raw)
    lengths, labels = store.episodes["length"], store.episodes["success"]
    for i in range(sampler.num_windows):
        e, j = int(raw["episode_index"][i]), int(raw["frame"][i])
        n_frames = -(-int(lengths[e]) // STRIDE)          # frames at steps 0, 3, 6, ... < length
        ok = bool(labels[e])
        assert b["reward"][i] == (1.0 if ok and j == n_frames - 1 else 0.0)
        assert b["mc_return"][i] == pytest.approx(gamma ** (n_frames - 1 - j) if ok else 0.0, rel=1e-6)
        assert b["discount"][i] == pytest.approx(gamma)
        assert bool(b["last"][i]) == (j == n_frames - 1)
    # the lower bound: a Bellman target of 0.5 everywhere is raised to the MC return where that is higher,
    # on the last dimension only
    y = torch.full((sampler.num_windows, 12), 0.5)
    bounded = with_mc_lower_bound(y, b["mc_return"])
    assert torch.equal(bounded[:, :-1], y[:, :-1])
    expected = [max(0.5, float(m)) for m in b["mc_return"]]
    assert bounded[:, -1].tolist() == pytest.approx(expected)
    assert (b["mc_return"] > 0.5).any() and (b["mc_return"] < 0.5).any()     # both cases occur


def test_early_share_draws_that_share_from_each_episodes_first_frames(store):
    """QUARD's choice between two objects is made in an episode's first frames: ``early_share`` of every batch
    ends there, the rest is the usual uniform draw; the chunk-aware stream refuses the option."""
    s = ImageWindowSampler(store, split="all", seed=3, early_frames=1, early_share=0.5)
    uniform = ImageWindowSampler(store, split="all", seed=3)
    for _ in range(3):
        frame = s.sample(200)["frame"]
        # 100 rows end in an episode's first frame; the uniform half adds its own few there
        assert int((frame == 0).sum()) >= 100
        assert int((frame > 0).sum()) > 0
    assert float((uniform.sample(2000)["frame"] == 0).float().mean()) < 0.3
    with pytest.raises(ValueError, match="early_share"):
        next(s.stream(8))
    with pytest.raises(ValueError, match="early_frames"):
        ImageWindowSampler(store, split="all", early_frames=0, early_share=0.2)
