"""``--compile-expert`` (``GaitController.compile_expert``): the gait expert's control law through
``torch.compile`` acts as the eager expert does on the same states, to float32's conditioning of its
Jacobian (not bit for bit), and the collection's flag reaches the controllers under every wrapper."""
import pytest
import torch

from quadforge.collection.collect import CollectConfig, build_env, build_policy
from quadforge.collection.collect_cmd import config_from_args
from quadforge.tools.cli import build_parser
from quadforge.envs.builder import make_env
from quadforge.envs.robots import get_robot
from quadforge.experts.gait import GaitController
from quadforge.experts.hierarchical import HierarchicalPolicy
from quadforge.experts.policy import compile_experts
from quadforge.experts.registry import load_policy

needs_cxx = pytest.mark.usefixtures("compiled_env")   # tests/conftest.py: a C++ compiler, an empty Dynamo cache


def _compiled(policy: GaitController) -> bool:
    return policy._control != policy._control_law   # a bound method: equal, not identical, to itself


@needs_cxx
def test_compiled_expert_acts_as_the_eager_one_on_the_same_states():
    env = make_env("go1", "mixed", num_envs=8, seed=3, overrides={"episode_length_s": 2.0})
    eager, compiled = (GaitController(get_robot("go1"), 8, env.dt) for _ in range(2))
    compiled.compile_expert()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    diffs = []
    for _ in range(150):   # the eager expert drives; both act on every state it visits, resets included
        a = eager.act(env.terms)
        diffs.append((compiled.act(env.terms) - a).abs().flatten())
        _, _, dones, _ = env.step(a)
        ids = dones.nonzero().flatten()
        if len(ids):
            eager.reset(ids)
            compiled.reset(ids)
    assert torch.equal(torch.stack([d.isfinite().all() for d in diffs]), torch.ones(len(diffs), dtype=torch.bool))
    d = torch.cat(diffs)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs and _compiled(compiled)
    # measured: mean 1e-4, largest 6e-3 (normalised; x0.25 rad). A foot's stance flipping one step apart on a
    # rounding of its phase would differ by far more: tolerated in one entry per thousand, never seen
    assert d.mean() < 1e-3 and (d > 2e-2).float().mean() < 1e-3


def test_the_collect_flag_compiles_the_gait_controller_under_every_wrapper():
    flags = ["--store", "s", "--episodes", "4", "--compile-expert", "--policy", "zero", "--relabel", "gait"]
    args = build_parser(with_subcommand="collect").parse_args(["collect", *flags])
    cfg = config_from_args(args)
    assert cfg.compile_expert
    policy = build_policy(cfg, build_env(CollectConfig(out="", episodes=1, num_envs=2), 0))
    assert _compiled(policy.labeller)                 # torch.compile is lazy: nothing compiled yet
    quard = HierarchicalPolicy(load_policy("quard_expert", 2), GaitController(get_robot("go1"), 2))
    compile_experts(quard)                             # the scripted high level has nothing to compile
    assert _compiled(quard.low)
    plain = CollectConfig(out="", episodes=1, num_envs=2)
    assert not _compiled(build_policy(plain, build_env(plain, 0)))


def test_a_policy_with_nothing_to_compile_is_named():
    with pytest.raises(ValueError, match="--compile-expert: zero has nothing to compile"):
        compile_experts(load_policy("zero", 2))


def test_collect_refuses_nothing_to_compile_before_any_work(tmp_path, capsys):
    """Refused by the config's validation: no store folder made, no "first step compiles" note printed;
    a checkpoint's action space decides when it is loaded, so a checkpoint spec passes validation."""
    from quadforge.tools.cli import main
    store = tmp_path / "s"
    assert main(["collect", "--store", str(store), "--episodes", "2", "--compile-expert", "--policy", "zero"]) == 2
    err = capsys.readouterr().err
    assert "--compile-expert: zero has nothing to compile" in err and "compiles" not in err.split("nothing")[0]
    assert not store.exists()
    parse = build_parser(with_subcommand="collect").parse_args
    for ok in (["--policy", "zero", "--relabel", "gait"], ["--policy", "gait:pace"], ["--task", "quard:stop"]):
        assert config_from_args(parse(["collect", "--store", str(store), "--episodes", "2", "--compile-expert", *ok])).compile_expert
    ckpt = tmp_path / "m.pt"
    ckpt.write_bytes(b"not read at validation")
    assert config_from_args(parse(["collect", "--store", str(store), "--episodes", "2", "--compile-expert", "--policy", f"model:{ckpt}"]))


def test_a_missing_cpp_compiler_is_named(monkeypatch):
    import torch._inductor.cpp_builder as builder

    def no_compiler():
        raise RuntimeError("No working C++ compiler found")
    monkeypatch.setattr(builder, "get_cpp_compiler", no_compiler)
    with pytest.raises(RuntimeError, match="--compile-expert compiles with torch.compile.*C\\+\\+ compiler"):
        GaitController(get_robot("go1"), 2).compile_expert()


def test_collect_says_that_its_first_step_compiles(monkeypatch, capsys, tmp_path):
    from quadforge.collection import collect_cmd
    from quadforge.tools.cli import main as cli_main
    monkeypatch.setattr(collect_cmd, "run_local", lambda cfg: {"compile_expert": cfg.compile_expert,
                                                                "in_store": cfg.episodes})
    assert cli_main(["collect", "--store", str(tmp_path / "s"), "--episodes", "2", "--compile-expert"]) == 0
    out = capsys.readouterr()
    assert "--compile-expert: the first control step compiles" in out.err and '"compile_expert": true' in out.out
    assert cli_main(["collect", "--store", str(tmp_path / "s"), "--episodes", "2"]) == 0
    assert "compiles" not in capsys.readouterr().err
