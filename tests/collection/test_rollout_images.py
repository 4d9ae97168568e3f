"""Camera frames, instructions and task parameters through the rollout loop and into the store."""
import numpy as np
import pytest

from quadforge.collection.background_writer import BackgroundWriter
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.data.writer import StagingWriter
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.validate import validate
from collection_fakes import CameraScriptedEnv, EchoPolicy


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_frames_are_recorded_every_stride_steps(stride):
    env = CameraScriptedEnv(num_envs=3, max_episode_length=7)
    rollout = Rollout(env, EchoPolicy(), RolloutConfig(frame_stride=stride))
    episodes = list(rollout.episodes(max_episodes=15))
    # frames stay out of the packed float32 step buffer
    assert not any(name.startswith("images/") for name, *_ in rollout._before.fields)
    for ep in episodes:
        rgb, depth = ep.features["images/front_rgb"], ep.features["images/front_depth"]
        assert len(rgb) == len(depth) == -(-ep.length // stride) and rgb.dtype == np.uint8
        env_id, k = int(ep.features["dof_pos"][0, 0]), int(ep.features["dof_pos"][0, 1])
        assert (rgb[:, 0, 0, 0] == env_id).all() and (rgb[:, 0, 0, 1] == k).all()
        steps = np.arange(0, ep.length, stride)
        assert rgb[:, 0, 0, 2].tolist() == steps.tolist()                 # frame j = step j * stride
        np.testing.assert_array_equal(depth[:, 0, 0], steps.astype(np.float32))
        assert ep.info["frame_stride"] == stride
        # the episode's task parameters are those of the episode it ran (read after its reset)
        assert ep.info["task_params"]["episode"] == k and ep.info["task_params"]["seed"] == 100 * env_id + k
        assert ep.info["task"] == f"quard:{ep.info['task_params']['family']}"
        text = ep.info["task_params"]["instruction"]
        assert ep.info["instruction"] == text
        idx = int(ep.features["instruction"][0])
        assert ep.info["instructions"] == {str(idx): text} and env.instruction_table[idx] == text


def test_default_stride_is_the_envs_then_ten():
    assert Rollout(CameraScriptedEnv(max_episode_length=5), EchoPolicy()).frame_stride == 10
    assert Rollout(CameraScriptedEnv(max_episode_length=5, frame_stride=5), EchoPolicy()).frame_stride == 5
    with pytest.raises(ValueError, match="--frame-stride=7 is not a multiple of the env's camera stride 5"):
        Rollout(CameraScriptedEnv(max_episode_length=5, frame_stride=5), EchoPolicy(), RolloutConfig(frame_stride=7))
    with pytest.raises(ValueError, match="frame_stride=0"):
        Rollout(CameraScriptedEnv(), EchoPolicy(), RolloutConfig(frame_stride=0))


def test_rollout_episodes_land_in_the_store(tmp_path):
    env = CameraScriptedEnv(num_envs=3, max_episode_length=9)
    rollout = Rollout(env, EchoPolicy(), RolloutConfig(frame_stride=4),
                      info_extra={"robot": "go1", "control_dt": env.dt})
    with BackgroundWriter(StagingWriter(tmp_path / "s", "cam")) as w:
        episodes = []
        for ep in rollout.episodes(max_episodes=10):
            w.submit(ep.features, ep.info)
            episodes.append(ep)
    compact(tmp_path / "s")
    s = TrajectoryStore.open(tmp_path / "s")
    assert validate(tmp_path / "s").ok and s.schema.frame_stride == 4
    assert s.instructions and set(s.instructions) <= set(env.instruction_table)
    per_step = s.load(["instruction"])["instruction"]
    for i, ep in enumerate(episodes):
        assert s.instructions[per_step[s.episodes["start"][i]]] == ep.info["instruction"] == s.instruction_text(i)
        assert s.task_params(i) == ep.info["task_params"]
    np.testing.assert_array_equal(s.load(["images/front_rgb"])["images/front_rgb"],
                                  np.concatenate([ep.features["images/front_rgb"] for ep in episodes]))


def test_collect_job_with_a_camera_env_resumes_to_the_target(tmp_path, monkeypatch):
    """The collection job over a camera env (the hook a QUARD env fills): a target count, then a top-up
    that resumes after the stored ids; frames, instructions and task parameters stay consistent."""
    import quadforge.collection.collect as collect
    monkeypatch.setattr(collect, "build_task_env",
                        lambda cfg, seed: CameraScriptedEnv(num_envs=cfg.num_envs, max_episode_length=9))
    monkeypatch.setattr(collect, "build_policy", lambda cfg, env, *seed: EchoPolicy())
    out = tmp_path / "s"
    cfg = collect.CollectConfig(out=str(out), episodes=5, task="quard:all", num_envs=3, frame_stride=4,
                                progress=False, compact_every=2).validate()
    first = collect.run_local(cfg)
    assert first["in_store"] == 5
    again = collect.run_local(collect.CollectConfig(**{**cfg.__dict__, "episodes": 8}).validate())
    assert again["already"] == 5 and again["in_store"] == 8
    s = TrajectoryStore.open(out)
    assert validate(out).ok and s.num_episodes == 8 and len(set(s.episode_ids)) == 8
    assert s.schema.frame_stride == 4 and set(s.episodes["task"]) <= {"quard:go_to", "quard:stop", "quard:distinguish"}
    rgb = s.load(["images/front_rgb"])["images/front_rgb"]
    starts, counts = s.frame_starts("images/front_rgb"), s.frame_counts("images/front_rgb")
    for e in range(8):
        steps = rgb[starts[e]:starts[e] + counts[e], 0, 0, 2]
        assert steps.tolist() == list(range(0, int(s.episodes["length"][e]), 4))
        assert s.instruction_text(e) == s.task_params(e)["instruction"]
