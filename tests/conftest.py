"""Test-session set-up shared by every test module."""
# MuJoCo picks its OpenGL platform when it is first imported, and test modules import mujoco before
# quadforge: importing quadforge first applies its MUJOCO_GL default (quadforge/__init__.py) to the whole
# session. Without it, `pytest tests/envs` alone chose GLFW and the first QUARD camera aborted the process
# on this display-less machine.
import quadforge  # noqa: F401

import pytest  # noqa: E402


@pytest.fixture
def compiled_env():
    """For a test of ``EnvConfig.compile_task``: skipped without a C++ compiler (the product's own check),
    and run from an empty Dynamo cache, so its compiled envs really compile (past Dynamo's recompile limit
    a frame runs eagerly, which comparisons with an eager env could not tell)."""
    import torch

    from quadforge.tensors import check_cpp_compiler
    try:
        check_cpp_compiler("this test")
    except RuntimeError as err:
        pytest.skip(str(err))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
