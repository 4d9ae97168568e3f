"""Extending by name: a policy kind is a registry entry, a task a small registered config; one
terrain-spec parser for every --terrain."""
import pytest
import torch

from quadforge.envs import builder
from quadforge.envs.terrain import TERRAIN_TYPES, terrain_config, terrain_types
from quadforge.experts import registry
from quadforge.experts.policy import check_policy


def test_builtin_policy_specs():
    gait = check_policy(registry.load_policy("gait:pace", num_envs=3))
    assert gait.policy_id == "gait:pace" and gait.action_space == "joint"
    zero = check_policy(registry.load_policy("zero", num_envs=2))
    assert zero.act({}).shape == (2, 12) and not zero.act({}).any()
    with pytest.raises(ValueError, match="unknown gait"):
        registry.load_policy("gait:gallop", num_envs=1)
    with pytest.raises(ValueError, match="is unknown; use a checkpoint path, or one of gait"):
        registry.load_policy("vla7b", num_envs=1)
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        registry.load_policy("rsl_rl:/no/such/model_1.pt", num_envs=1)


def test_a_new_policy_kind_is_one_registration(monkeypatch):
    monkeypatch.setattr(registry, "POLICY_KINDS", dict(registry.POLICY_KINDS))

    class Command:  # a high-level policy, as a VLA is
        obs_terms, action_space, action_dim, policy_id = ("base_ang_vel",), "command", 12, "cmd:test"

        def __init__(self, n):
            self.n = n

        def reset(self, env_ids):
            pass

        def act(self, obs):
            return torch.zeros(self.n, 12)

    registry.register_policy_kind("cmdtest", lambda arg, ctx: Command(ctx.num_envs), "a test kind", needs_path=False)
    assert "cmdtest" in registry.spec_help()
    assert registry.load_policy("cmdtest", num_envs=4).action_space == "command"
    with pytest.raises(ValueError, match="already registered"):
        registry.register_policy_kind("cmdtest", lambda arg, ctx: None, "again")


def test_terrain_spec_parser():
    assert terrain_config("flat") is None
    assert terrain_config("plane_grid").plane
    assert set(terrain_config("mixed").proportions) == set(TERRAIN_TYPES)
    assert terrain_config("stairs_up,gaps").proportions == {"stairs_up": 0.5, "gaps": 0.5}
    per_type = terrain_config("mixed", one_column_per_type=True, num_levels=4)
    assert per_type.num_cols == len(TERRAIN_TYPES) and per_type.num_levels == 4
    assert terrain_types("gaps,gaps") == ["gaps"]
    with pytest.raises(ValueError, match="unknown terrain types \\['lava'\\]"):
        terrain_config("flat,lava")


def test_a_new_task_is_one_registration(monkeypatch):
    monkeypatch.setattr(builder, "TASKS", dict(builder.TASKS))

    def short_episodes(cfg):
        cfg.episode_length_s = 1.0
        return cfg

    builder.register_task("test:short", short_episodes, "1 s episodes")
    cfg = builder.make_env_config(task="test:short", num_envs=2, overrides={"commands.resample": False})
    assert cfg.episode_length_s == 1.0 and cfg.commands.resample is False and cfg.num_envs == 2
    with pytest.raises(ValueError, match="--task='nope' is unknown; allowed: locomotion"):
        builder.make_env_config(task="nope")
    with pytest.raises(ValueError, match="is invalid; allowed: a number"):
        builder.make_env_config(overrides={"episode_length_s": "long"})


# ------------------------------------------------------------------ one builder, one loader (docs/architecture.md)
_ENV_CLASSES = {"LeggedEnv", "QuardEnv"}
_POLICY_LOADERS = {"load_expert", "load_learned", "load_germ", "load_vla", "QuardExpert", "make_quard_expert"}
# (module, name called) -> why it calls a loader directly
_DIRECT_LOADS = {("training/vla_probe.py", "load_vla"): "an offline probe of a VLA's outputs on stored windows: no env",
                 ("training/binding_probe.py", "load_vla"): "a probe of a VLA's front-end and first command on rendered "
                                                            "first frames: the model's parts, no rollout"}


def _calls(folders, names):
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name in names:
                        found.append((str(path.relative_to(root)), name))
    return found


def test_every_env_is_built_by_make_env_and_every_policy_loaded_by_load_policy():
    """Outside envs/ nothing constructs an env class (``envs.builder.make_env`` builds them all); outside
    experts/ nothing calls a policy loader but the registry's ``load_policy`` / ``policy_for_env``."""
    import tomllib
    from pathlib import Path
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())   # every installed top folder
    assert {"envs", "experts", "collection"} <= folders
    assert _calls(sorted(folders - {"envs"}), _ENV_CLASSES) == []
    direct = _calls(sorted(folders - {"experts"}), _POLICY_LOADERS)
    assert [c for c in direct if c not in _DIRECT_LOADS] == []


def test_make_env_config_takes_typed_terrain_and_adjust():
    from dataclasses import replace

    from quadforge.collection.collect import CollectConfig, _collection_settings
    from quadforge.envs.terrain import TerrainConfig
    tc = TerrainConfig.of_types(["slope_up"], num_levels=3, num_cols=1)
    assert builder.make_env_config(terrain=tc).terrain is tc and builder.make_env_config(terrain=None).terrain is None
    with pytest.raises(ValueError, match="a built TerrainConfig carries its own grid"):
        builder.make_env_config(terrain=tc, one_column_per_type=True)
    # adjust runs after the task's configure and before the command line's overrides
    cfg = builder.make_env_config(adjust=lambda c: replace(c, episode_length_s=3.0, curriculum=False),
                                  overrides={"episode_length_s": 5.0})
    assert cfg.episode_length_s == 5.0 and cfg.curriculum is False
    # collect's settings, typed, equal what the dotted keys set
    job = CollectConfig(out="unused", episodes=1, push=0.7, push_interval_s=3.0, max_episode_s=6.0)
    typed = builder.make_env_config(adjust=lambda c: _collection_settings(job, c))
    dotted = builder.make_env_config(overrides={"episode_length_s": 6.0, "commands.resample": False,
                                                "randomization.push_robots": True,
                                                "randomization.max_push_vel_xy": 0.7,
                                                "randomization.push_interval_s": 3.0})
    assert typed == dotted
    # and evaluation's
    from quadforge.evaluation.evaluate import EvalConfig, _evaluation_settings
    ev = EvalConfig(max_episode_s=7.0)
    typed = builder.make_env_config(adjust=lambda c: _evaluation_settings(ev, c))
    dotted = builder.make_env_config(overrides={"curriculum": False, "episode_length_s": 7.0,
                                                "commands.resample": False, "randomization.push_robots": False})
    assert typed == dotted


# ------------------------------------------------------------------ robots (envs.robots.register_robot)
@pytest.fixture
def go1_copy():
    """A registered robot 'go1_copy': go1's spec under another name, unregistered afterwards."""
    from dataclasses import replace

    from quadforge.envs import robots
    robots.register_robot("go1_copy", lambda: replace(robots.get_robot("go1"), name="go1_copy"))
    yield "go1_copy"
    robots.ROBOTS.pop("go1_copy", None)
    robots._CACHE.pop("go1_copy", None)


def test_a_registered_robot_is_taken_everywhere(go1_copy, tmp_path, capsys):
    import json

    from quadforge.collection.collect import CollectConfig
    from quadforge.envs.robots import get_robot, register_robot
    from quadforge.evaluation.evaluate import EvalConfig
    from quadforge.tools.cli import main
    env = builder.make_env(robot=go1_copy, num_envs=2)
    try:
        assert env.robot.name == go1_copy and env.step(torch.zeros(2, 12))[0] is not None
    finally:
        env.close()
    policy = registry.load_policy("gait", 2, robot=go1_copy)
    assert policy.act  # the gait expert of the new robot
    assert CollectConfig(out=str(tmp_path / "s"), episodes=1, robot=go1_copy).validate().robot == go1_copy
    assert EvalConfig(out=str(tmp_path / "e"), robot=go1_copy).validate().robot == go1_copy
    assert main(["info", "--json", str(tmp_path / "info.json")]) == 0
    assert go1_copy in json.loads((tmp_path / "info.json").read_text())["robots"]
    assert go1_copy in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    assert f"go1 | aliengo | {go1_copy}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="robot 'go1_copy' is already registered"):
        register_robot(go1_copy, lambda: get_robot("go1"))
    with pytest.raises(ValueError, match="robot=.spot. is invalid; allowed: go1, aliengo, go1_copy"):
        registry.load_policy("gait", 2, robot="spot")


def test_register_task_refuses_a_name_taken_or_inside_a_prefix(monkeypatch):
    """register_task('quard:go_to', ...) shadowed the real QUARD task and task_names() listed it twice."""
    monkeypatch.setattr(builder, "TASKS", dict(builder.TASKS))
    real = builder.get_task("quard:go_to")   # the prefix's module loaded
    with pytest.raises(ValueError, match="the prefix 'quard:' belongs to the task family"):
        builder.register_task("quard:go_to", lambda cfg: cfg, "mine")
    with pytest.raises(ValueError, match="task 'locomotion' is already registered"):
        builder.register_task("locomotion", lambda cfg: cfg, "mine")
    assert builder.get_task("quard:go_to").help == real.help and builder.task_names().count("quard:go_to") == 1
    builder.register_task("test:fast", lambda cfg: cfg, "fast walking", default_policy="zero")
    assert builder.get_task("test:fast").default_policy == "zero"
    with pytest.raises(ValueError, match="the registered tasks \\['test:fast'\\] are inside it"):
        builder.register_task_prefix("test", builder.get_task, lambda: ())


@pytest.fixture
def fast_walk(monkeypatch):
    """A registered LeggedEnv task 'fast_walk' (forward commands only), its configure calls counted."""
    from dataclasses import replace
    monkeypatch.setattr(builder, "TASKS", dict(builder.TASKS))
    calls = []

    def fast(cfg):
        calls.append(cfg.num_envs)
        return replace(cfg, commands=replace(cfg.commands, ranges={**cfg.commands.ranges, "lin_vel_x": (1.0, 1.5)}))

    builder.register_task("fast_walk", fast, "fast forward walking", default_policy="gait")
    return calls


def test_a_registered_task_collects_and_rolls_out(fast_walk, tmp_path, capsys):
    """collect refused it (its task list was locomotion + quard:*), rollout handed it QUARD's task options."""
    import json

    from quadforge.collection.collect import CollectConfig, collect_tasks, run_local
    from quadforge.data.store import TrajectoryStore
    from quadforge.tools.cli import main
    assert "fast_walk" in collect_tasks()
    cfg = CollectConfig(out=str(tmp_path / "s"), episodes=2, task="fast_walk", num_envs=2, max_episode_s=0.2,
                        progress=False).validate()
    assert cfg.policy == "gait"                                 # the task's registered default policy
    assert run_local(cfg)["in_store"] == 2 and fast_walk        # its configure built the collector's env
    assert TrajectoryStore.open(tmp_path / "s").num_episodes == 2
    with pytest.raises(ValueError, match="--frame-stride applies to the camera tasks"):
        CollectConfig(out=str(tmp_path / "t"), episodes=1, task="fast_walk", frame_stride=3).validate()
    fast_walk.clear()
    out = tmp_path / "r.json"
    assert main(["rollout", "--task", "fast_walk", "--num-envs", "2", "--seconds", "0.2", "--json", str(out)]) == 0
    assert "policy=gait" in capsys.readouterr().out and fast_walk == [2]
    assert json.loads(out.read_text())["mean_command"]["lin_vel_x"] >= 1.0   # the task's own commands
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    assert "fast_walk" in capsys.readouterr().out


# ------------------------------------------------------------------ observation terms (envs.observations.register_term)
def test_a_new_term_without_a_function_is_named_and_one_registers_its_function(monkeypatch):
    """A TERM_DIMS entry without a function failed every env with a bare AssertionError (gone under python -O)."""
    from quadforge.envs import observations
    from quadforge.layout import TERM_DIMS
    monkeypatch.setattr(observations, "TERM_FUNCTIONS", {})
    monkeypatch.setitem(TERM_DIMS, "foot_load", 4)
    with pytest.raises(ValueError, match=r"observation terms \['foot_load'\] of quadforge.terms.TERM_DIMS have no "
                                         r"function: register one with envs.observations.register_term"):
        builder.make_env(num_envs=2)
    observations.register_term("foot_load", lambda v: 2.0 * v.state.foot_contact.to(torch.float32))
    monkeypatch.setitem(TERM_DIMS, "task_mine", 2)        # a task's term: no function, zeros outside its task
    env = builder.make_env(num_envs=2)
    try:
        assert torch.equal(env.terms["foot_load"], 2.0 * env.terms["foot_contacts"])
        assert torch.equal(env.terms["task_mine"], torch.zeros(2, 2))
    finally:
        env.close()
    with pytest.raises(ValueError, match="register_term\\('nope'\\): no such term"):
        observations.register_term("nope", lambda v: None)
    with pytest.raises(ValueError, match="already has a registered function"):
        observations.register_term("foot_load", lambda v: None)
