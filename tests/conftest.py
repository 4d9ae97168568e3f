"""Test-session set-up shared by every test module."""
import os

# MuJoCo picks its OpenGL platform when it is first imported, and test modules import mujoco before
# quadforge (whose __init__ defaults MUJOCO_GL to egl): without this, `pytest tests/envs` alone chose GLFW
# and the first QUARD camera aborted the process on this display-less machine.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
