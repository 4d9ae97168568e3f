"""A VLA loaded for an env sees that env's instruction table (its ``instruction`` term indexes it)."""
from types import SimpleNamespace

from quadforge.experts import registry


def test_policy_for_env_hands_the_env_instruction_table_to_the_loader(monkeypatch):
    seen = {}

    def load(arg, ctx):
        seen["instructions"] = ctx.instructions
        return SimpleNamespace(action_space="joint", policy_id="capture")

    monkeypatch.setitem(registry.POLICY_KINDS, "capture_ctx",
                        registry.PolicyKind("capture_ctx", load, "test", needs_path=False))
    env = SimpleNamespace(num_envs=2, device="cpu", dt=0.02, robot=SimpleNamespace(name="go1"),
                          instruction_table=["go to the red ball", "stop the blue ball"])
    registry.policy_for_env("capture_ctx", env)
    assert seen["instructions"] == ["go to the red ball", "stop the blue ball"]
    plain = SimpleNamespace(num_envs=2, device="cpu", dt=0.02, robot=SimpleNamespace(name="go1"))
    registry.policy_for_env("capture_ctx", plain)             # an env without instructions: None
    assert seen["instructions"] is None
