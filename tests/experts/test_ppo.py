"""`quadforge train-expert`: presets, overrides, a real (tiny) OnPolicyRunner run with checkpoints that
load back as Policies acting exactly like the trained actor, resume, determinism and CLI errors."""
import pytest
import torch
from tensordict import TensorDict

from quadforge.envs.config import EnvConfig
from quadforge.layout import LEGGED_GYM_48, TERM_DIMS
from quadforge.experts.loaders import load_expert
from quadforge.experts.policy import check_policy
from quadforge.training.ppo import (PRESETS, TrainExpertConfig, apply_env_overrides, apply_preset_overrides,
                         latest_checkpoint, parse_overrides, rsl_rl_train_cfg, train)
from quadforge.tools.cli import main

torch.set_num_threads(1)
TINY = {"num_steps_per_env": 4, "actor_hidden_dims": [16], "critic_hidden_dims": [16], "save_interval": 1,
        "num_learning_epochs": 1, "num_mini_batches": 2, "env.episode_length_s": 0.1}


def _train(out, iterations=2, resume=None, seed=0, **extra):
    cfg = TrainExpertConfig(out=str(out), num_envs=4, iterations=iterations, resume=resume, seed=seed,
                            overrides={**TINY, **extra})
    return train(cfg)


def test_legged_gym_preset_is_the_papers_ppo():
    cfg = rsl_rl_train_cfg(PRESETS["legged_gym"])
    alg = cfg["algorithm"]
    assert cfg["actor"]["hidden_dims"] == [512, 256, 128] == cfg["critic"]["hidden_dims"]
    assert cfg["actor"]["activation"] == "elu" and cfg["num_steps_per_env"] == 24
    assert (alg["learning_rate"], alg["schedule"], alg["desired_kl"]) == (1e-3, "adaptive", 0.01)
    assert (alg["num_learning_epochs"], alg["num_mini_batches"], alg["clip_param"]) == (5, 4, 0.2)
    assert (alg["gamma"], alg["lam"], alg["entropy_coef"]) == (0.99, 0.95, 0.01)
    assert cfg["obs_groups"] == {"actor": ["policy"], "critic": ["critic"]}
    assert PRESETS["cpu"].num_envs < PRESETS["legged_gym"].num_envs


def test_overrides_parse_and_validate():
    ov = parse_overrides(["learning_rate=3e-4", "actor_hidden_dims=[64, 32]", "activation=relu",
                          "env.commands.ranges.lin_vel_x=(0.0, 1.0)", "env.randomization.push_robots=False"])
    p = apply_preset_overrides(PRESETS["cpu"], ov)
    assert p.learning_rate == 3e-4 and p.actor_hidden_dims == (64, 32) and p.activation == "relu"
    env_cfg = EnvConfig.flat()
    apply_env_overrides(env_cfg, ov)
    assert env_cfg.commands.ranges["lin_vel_x"] == (0.0, 1.0) and env_cfg.randomization.push_robots is False
    with pytest.raises(ValueError, match="override 'lr' is unknown; allowed"):
        apply_preset_overrides(PRESETS["cpu"], {"lr": 1.0})
    with pytest.raises(ValueError, match=r"no field env\.comands"):
        apply_env_overrides(EnvConfig.flat(), {"env.comands.mode": "gait"})
    with pytest.raises(ValueError, match="gamma=1.5 is invalid"):
        apply_preset_overrides(PRESETS["cpu"], {"gamma": 1.5})
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["learning_rate"])


def test_train_checkpoint_loads_as_the_trained_actor(tmp_path):
    last = _train(tmp_path / "run", iterations=2)
    assert last.name == "model_1.pt" and (tmp_path / "run" / "model_0.pt").is_file()
    assert list((tmp_path / "run").glob("events.out.tfevents.*")), "no TensorBoard log"
    ckpt = torch.load(last, weights_only=True)
    meta = ckpt["infos"]["quadforge"]
    assert meta["robot"] == "go1" and meta["policy_layout"]["name"] == "legged_gym_48"
    assert meta["critic_layout"] == "legged_gym_235" and ckpt["iter"] == 1

    policy = check_policy(load_expert(last, num_envs=4))
    assert policy.layout.name == "legged_gym_48"
    # the wrapper's observation from raw terms is the env's noise-free policy observation
    from quadforge.envs.vec_env import LeggedEnv
    cfg = EnvConfig.flat(num_envs=4, seed=3)
    cfg.backend.num_threads = 1
    cfg.observations.add_noise = False
    env = LeggedEnv(cfg)
    try:
        env.step(0.3 * torch.randn(4, 12, generator=torch.Generator().manual_seed(0)))
        obs = env.get_observations()["policy"]
        torch.testing.assert_close(policy.observation(env.terms), obs)
        # and its actions are the trained actor's deterministic output on it
        from rsl_rl.models import MLPModel
        actor = MLPModel(TensorDict({"policy": obs}, batch_size=[4]), {"actor": ["policy"]}, "actor", 12,
                         hidden_dims=[16], distribution_cfg={"class_name": "rsl_rl.modules.GaussianDistribution"})
        actor.load_state_dict(ckpt["actor_state_dict"])
        with torch.no_grad():
            torch.testing.assert_close(policy.act(env.terms), actor(TensorDict({"policy": obs}, batch_size=[4])))
    finally:
        env.close()


def test_resume_continues_from_the_checkpoint(tmp_path):
    first = _train(tmp_path / "a", iterations=2)
    assert first.name == "model_1.pt"   # updates 0 and 1
    resumed = _train(tmp_path / "b", iterations=2, resume=str(first))
    ckpt = torch.load(resumed, weights_only=True)
    # the continued run does updates 2 and 3, named as an uninterrupted 4-iteration run names them
    assert ckpt["iter"] == 3 and resumed.name == "model_3.pt"
    assert latest_checkpoint(tmp_path / "b") == resumed
    assert sorted(p.name for p in (tmp_path / "b").glob("model_*.pt")) == ["model_2.pt", "model_3.pt"]


def test_resume_in_place_never_rewrites_a_checkpoint(tmp_path):
    first = _train(tmp_path, iterations=2)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("model_*.pt")}
    _train(tmp_path, iterations=2, resume=str(first))                 # --resume: from the highest
    after = {p.name: p.read_bytes() for p in tmp_path.glob("model_*.pt")}
    assert sorted(after) == ["model_0.pt", "model_1.pt", "model_2.pt", "model_3.pt"]
    assert all(after[name] == data for name, data in before.items())


def test_resume_from_an_earlier_checkpoint_refuses_to_overwrite_later_ones(tmp_path):
    _train(tmp_path, iterations=3)                                    # model_0 .. model_2
    before = {p.name: p.read_bytes() for p in tmp_path.glob("model_*.pt")}
    with pytest.raises(ValueError, match=r"would write model_1.pt, model_2.pt over checkpoints already there"):
        _train(tmp_path, iterations=2, resume=str(tmp_path / "model_0.pt"))
    assert {p.name: p.read_bytes() for p in tmp_path.glob("model_*.pt")} == before
    resumed = _train(tmp_path / "branch", iterations=2, resume=str(tmp_path / "model_0.pt"))  # a new folder
    assert resumed.name == "model_2.pt"


def test_same_seed_same_weights(tmp_path):
    a = torch.load(_train(tmp_path / "a", iterations=1, seed=5), weights_only=True)["actor_state_dict"]
    b = torch.load(_train(tmp_path / "b", iterations=1, seed=5), weights_only=True)["actor_state_dict"]
    for k in a:
        torch.testing.assert_close(a[k], b[k])


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["train-expert", "--out", str(tmp_path), "--preset", "gpu"]) == 2
    assert "--preset='gpu' is invalid; allowed: ['cpu', 'legged_gym']" in capsys.readouterr().err
    assert main(["train-expert", "--out", str(tmp_path), "--resume-from", str(tmp_path / "none.pt")]) == 2
    assert "no such checkpoint file" in capsys.readouterr().err
    assert main(["train-expert", "--out", str(tmp_path), "--terrain", "lava"]) == 2
    assert "unknown terrain types ['lava']" in capsys.readouterr().err
    # `--resume KEY=VALUE`: the override stays an override (not the old spelling's checkpoint PATH)
    assert main(["train-expert", "--out", str(tmp_path), "--resume", "num_steps_per_env=4", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "--resume/--resume-from and --overwrite contradict" in err and "deprecated" not in err


def test_tracking_eval_scores_one_first_episode_per_env_on_every_terrain(tmp_path):
    from quadforge.envs.terrain import TERRAIN_TYPES
    from quadforge.evaluation.tracking_eval import evaluate, training_overrides
    last = _train(tmp_path / "run", iterations=1, **{"env.commands.ranges.lin_vel_y": (0.0, 0.0)})
    overrides = training_overrides(str(last))
    assert overrides["env.commands.ranges.lin_vel_y"] == (0.0, 0.0) and overrides["env.episode_length_s"] == 0.1
    res = evaluate(str(last), envs_per_type=2, episode_s=0.2, overrides={})
    assert list(res) == ["plane", *TERRAIN_TYPES]
    for row in res.values():
        assert row["episodes"] == 2 and 0.0 <= row["fall_rate"] <= 1.0
        assert 0.0 < row["mean_length_s"] <= 0.2 + 1e-6 and row["lin_vel_error"] >= 0.0


@pytest.mark.parametrize("name", ["go1_flat_forward_ppo.pt", "go1_flat_forward_ppo_height.pt"])
def test_shipped_checkpoint_walks_forward_on_command(name):
    from pathlib import Path

    from quadforge.envs.vec_env import LeggedEnv
    path = Path(__file__).resolve().parents[2] / "experts" / "checkpoints" / name
    cfg = EnvConfig.flat(num_envs=8, seed=11)
    cfg.backend.num_threads = 1
    cfg.randomization.push_robots = False
    env = LeggedEnv(cfg)
    try:
        policy = check_policy(load_expert(path, robot="go1", num_envs=8))
        commands = env.commands.clone()
        commands[:, 0], commands[:, 1:3] = 0.8, 0.0
        env.set_commands(torch.arange(8), commands)
        policy.reset(torch.arange(8))
        start = env.backend.state.root_pos_w[:, 0].clone()
        for _ in range(150):  # 3 s
            _, _, dones, _ = env.step(policy.act(env.terms))
            assert not dones.any(), "the shipped expert fell (or timed out) within 3 s on flat ground"
        forward = env.backend.state.root_pos_w[:, 0] - start
        # 0.8 m/s for 3 s is 2.4 m; a walker that tracks roughly covers well over half of it
        assert forward.min() > 1.2, forward
    finally:
        env.close()


def test_a_resume_in_place_keeps_the_runs_settings_and_one_training_writes_a_folder(tmp_path):
    """`--resume` in its own --out continues that run: another terrain, seed or number of envs is refused
    (the checkpoints would carry the first run's name and count); `--resume-from` into a new folder is a
    new run and may change them. While a run writes its --out it holds the folder's training lock."""
    from quadforge.data.locks import acquire
    from quadforge.output_paths import RUN_LOCK
    first = _train(tmp_path / "run", iterations=1)
    for change, match in ((dict(seed=3), "--seed 0 then, 3 now"), (dict(terrain="slope_up"), "--terrain 'flat' then")):
        cfg = TrainExpertConfig(out=str(tmp_path / "run"), num_envs=4, iterations=1, resume=str(first),
                                overrides=dict(TINY), **{"seed": 0, **change})
        with pytest.raises(ValueError, match=match):
            train(cfg)
    cfg = TrainExpertConfig(out=str(tmp_path / "run"), num_envs=8, iterations=1, resume=str(first), overrides=dict(TINY))
    with pytest.raises(ValueError, match="--num-envs 4 then, 8 now"):
        train(cfg)
    assert _train(tmp_path / "branch", iterations=1, resume=str(first), seed=3).is_file()   # a new run: allowed
    with acquire(tmp_path / "run" / RUN_LOCK, "another training"):   # a run still writing the folder
        with pytest.raises(ValueError, match="another training"):
            _train(tmp_path / "run", iterations=1, resume=str(first))


def test_a_resume_after_a_kill_logs_each_iteration_once_and_checkpoints_are_written_whole(tmp_path, monkeypatch):
    """A run killed after logging iterations it never saved (model_1/model_2 gone): the resume from model_0
    logs 1.. again, and TensorBoard keeps one value per step (purge_step, as `train` does). A save that
    fails mid-write leaves the earlier file and no partial one (a kill left a truncated model_<it>.pt that
    --resume took as the latest); a damaged latest checkpoint names the one before it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    _train(run, iterations=3)
    for name in ("model_1.pt", "model_2.pt"):
        (run / name).unlink()
    _train(run, iterations=2, resume=str(run / "model_0.pt"))
    events = EventAccumulator(str(run))
    events.Reload()
    tag = next(t for t in events.Tags()["scalars"] if t.startswith("Loss/"))
    assert [e.step for e in events.Scalars(tag)] == [0, 1, 2]

    before = (run / "model_2.pt").read_bytes()

    def torn_save(obj, path, *a, **kw):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 torn")
        raise OSError("killed mid-write")
    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError, match="killed mid-write"):
        _train(run, iterations=1, resume=str(run / "model_2.pt"))
    monkeypatch.undo()
    assert (run / "model_2.pt").read_bytes() == before and not list(run.glob("*.partial")) \
        and not (run / "model_3.pt").exists()
    (run / "model_2.pt").write_bytes(before[: len(before) // 2])
    with pytest.raises(ValueError, match=r"the run's checkpoint before it is .*model_1.pt: move the damaged file "
                                         r"away and continue from that one \(--resume-from .*model_1.pt\)"):
        _train(run, iterations=1, resume=str(run / "model_2.pt"))


def test_a_resumed_run_spreads_its_envs_episode_clocks_as_a_fresh_one(tmp_path, monkeypatch):
    """Started at 0 in every env, a resumed run's episodes would all time out in the same step once an
    episode length: the batch resets at once and that rollout is all time-out bootstraps."""
    from rsl_rl.runners import OnPolicyRunner   # train-expert's runner inherits its learn
    seen = []
    learn = OnPolicyRunner.learn

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("init_at_random_ep_len"))
        return learn(self, *args, **kwargs)

    monkeypatch.setattr(OnPolicyRunner, "learn", recording)
    first = _train(tmp_path / "a", iterations=1)
    _train(tmp_path / "b", iterations=1, resume=str(first))
    assert seen == [True, True]


def test_a_trained_action_clip_goes_with_the_checkpoint(tmp_path):
    """env.observations.clip_actions clips the actions in training: the loaded policy clips them there too,
    in an env of default settings (which clips at 100)."""
    last = _train(tmp_path / "run", iterations=1, **{"env.observations.clip_actions": 0.05})
    assert torch.load(last, weights_only=True)["infos"]["quadforge"]["clip_actions"] == 0.05
    policy = load_expert(last, num_envs=4)
    terms = {n: torch.randn(4, TERM_DIMS[n]) * 3 for n in policy.obs_terms}
    assert policy.clip_actions == 0.05 and policy.act(terms).abs().max() <= 0.05 + 1e-7
