"""Test-session set-up shared by every test module."""
# MuJoCo picks its OpenGL platform when it is first imported, and test modules import mujoco before
# quadforge: importing quadforge first applies its MUJOCO_GL default (quadforge/__init__.py) to the whole
# session. Without it, `pytest tests/envs` alone chose GLFW and the first QUARD camera aborted the process
# on this display-less machine.
import quadforge  # noqa: F401
