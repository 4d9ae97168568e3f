"""``EnvConfig.compile_task``: the task's per-step scoring through ``torch.compile`` gives the eager step's
results within float rounding (the same episodes, ends and reasons), in and out of inference mode, and
leaves the eager step alone."""
import pytest
import torch

from quadforge.envs.builder import make_env
from quadforge.envs.config import EnvConfig
from quadforge.tensors import into

needs_cxx = pytest.mark.usefixtures("compiled_env")   # tests/conftest.py: a C++ compiler, an empty Dynamo cache


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _rollout(env, steps: int, inference: bool) -> list[tuple]:
    """Per step: policy and critic observations, rewards, dones, time-outs, episode-end reasons and the
    step's log, under one action sequence large enough to make robots fall."""
    g = torch.Generator().manual_seed(1)
    out = []
    with torch.inference_mode() if inference else torch.no_grad():
        for _ in range(steps):
            obs, rew, dones, extras = env.step(torch.randn(env.num_envs, env.num_actions, generator=g) * 1.5)
            out.append((obs["policy"].clone(), obs["critic"].clone(), rew.clone(), dones.clone(),
                        extras["time_outs"].clone(), extras["episode_end"]["termination_reason"].clone(),
                        dict(extras["log"])))
    return out


def _assert_same_episodes(eager: list[tuple], compiled: list[tuple]) -> None:
    for t, (e, c) in enumerate(zip(eager, compiled)):
        for i in (0, 1, 2):   # observations and rewards: float rounding at most
            torch.testing.assert_close(c[i], e[i], rtol=1e-5, atol=1e-6, msg=lambda m: f"step {t}: {m}")
        for i in (3, 4, 5):   # which episodes end, and why: exactly
            assert torch.equal(c[i], e[i]), f"step {t}: episode ends differ"
        assert e[6].keys() == c[6].keys()
        for k, v in e[6].items():
            assert c[6][k] == pytest.approx(v, rel=1e-5, abs=1e-6), f"step {t}: log {k}"


@needs_cxx
@pytest.mark.parametrize("inference", [False, True], ids=["no_grad", "inference_mode"])
def test_compiled_score_gives_the_eager_step_within_rounding(inference):
    over = {"episode_length_s": 0.5}   # time-outs, falls and resets inside the rollout
    eager = make_env("go1", "flat", num_envs=8, seed=5, overrides=over)
    compiled = make_env("go1", "flat", num_envs=8, seed=5, overrides={**over, "compile_task": True})
    before = _graphs()
    e, c = _rollout(eager, 60, inference), _rollout(compiled, 60, inference)
    assert _graphs() > before
    ends = torch.stack([step[5] for step in e])
    assert (ends == 1).any() and (ends > 1).any(), "the rollout should hold time-outs and terminations"
    _assert_same_episodes(e, c)
    assert compiled.task._score is not compiled.task.score and eager.task._score == eager.task.score


@pytest.mark.slow
@needs_cxx
def test_compiled_score_on_rough_terrain_with_curriculum_and_a_quard_task():
    over = {"episode_length_s": 0.5, "curriculum": True}
    eager = make_env("go1", "mixed", num_envs=8, seed=2, overrides=over)
    compiled = make_env("go1", "mixed", num_envs=8, seed=2, overrides={**over, "compile_task": True})
    before = _graphs()
    _assert_same_episodes(_rollout(eager, 60, True), _rollout(compiled, 60, True))
    assert _graphs() > before
    opts = {"images": False}
    eager = make_env(task="quard:go_to", num_envs=4, seed=0, task_options=opts)
    compiled = make_env(task="quard:go_to", num_envs=4, seed=0, task_options=opts, overrides={"compile_task": True})
    before = _graphs()
    _assert_same_episodes(_rollout(eager, 40, True), _rollout(compiled, 40, True))
    assert _graphs() > before


def test_compile_task_must_be_a_bool():
    cfg = EnvConfig.flat()
    cfg.compile_task = "yes"
    with pytest.raises(ValueError, match="compile_task"):
        cfg.validate()


def test_a_missing_cpp_compiler_is_named_when_the_env_is_built(monkeypatch):
    import torch._inductor.cpp_builder as builder

    def no_compiler():
        raise RuntimeError("No working C++ compiler found")
    monkeypatch.setattr(builder, "get_cpp_compiler", no_compiler)
    with pytest.raises(RuntimeError, match="compile_task=True.*C\\+\\+ compiler"):
        make_env(overrides={"compile_task": True})


def test_into_writes_a_strided_view_eagerly_and_compiled():
    buf = torch.zeros(4, 3)
    a, b = torch.arange(8.0).reshape(4, 2), torch.ones(4, 2)
    into(torch.sub, a, b, out=buf[:, :2])
    assert torch.equal(buf[:, :2], a - b) and torch.equal(buf[:, 2], torch.zeros(4))

    @torch.compile(backend="eager", fullgraph=True)   # Dynamo's tracing alone: no C++ compiler needed
    def traced(x, y, out):
        into(torch.linalg.vector_norm, x - y, dim=1, out=out[:, 2])
        return out
    got = traced(a, b, buf.clone())
    assert torch.equal(got[:, 2], torch.linalg.vector_norm(a - b, dim=1)) and torch.equal(got[:, :2], a - b)


@needs_cxx
def test_the_benchmarks_time_the_compiled_task_beside_the_eager_one():
    from quadforge.tools.bench.env_step import compiled_pair
    from quadforge.tools.bench.scale import measure_one
    pair = compiled_pair("flat", 4, 1, steps=3, rounds=1)
    assert all(pair[f"{part} {label}"] > 0 for part in ("task", "score") for label in ("eager", "compiled"))
    assert pair["env/raw eager"] > 0 and pair["env/raw compiled"] > 0 and pair["first_steps_s"] > 0
    before = _graphs()
    row = measure_one("mujoco_cpu", 2, 2, 1, lambda: None, env_overrides={"compile_task": True})   # bench scale's variant
    assert _graphs() > before and row["env"] > 0 and row["task"] > 0


def test_a_gpu_without_triton_is_named_before_any_compile(monkeypatch):
    """On a GPU torch.compile builds Triton kernels: without Triton the check says so up front (a GPU
    machine carried without it met torch's own error at the first compiled step)."""
    import torch.utils._triton as triton_probe

    from quadforge.tensors import check_compiler
    monkeypatch.setattr(triton_probe, "has_triton", lambda: False)
    with pytest.raises(RuntimeError, match="--compile-expert compiles with torch.compile, which on a GPU needs Triton"):
        check_compiler("--compile-expert", "cuda:0")
    monkeypatch.setattr(triton_probe, "has_triton", lambda: True)
    check_compiler("--compile-expert", "cuda:0")
