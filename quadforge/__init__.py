"""quadforge: legged-robot learning.

The card's top-level folders (envs/ experts/ collection/ training/ data/ tools/) are installed as
``quadforge.envs``, ``quadforge.experts``, ... (see ``[tool.setuptools.package-dir]`` in pyproject.toml),
so a user's own ``tools/`` or ``data/`` folder can never shadow them.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("quadforge")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# MuJoCo picks its OpenGL platform when it is first imported; headless EGL is the only one that works
# on a machine without a display (the QUARD camera renders offscreen). A user's own choice wins.
import os as _os

if "MUJOCO_GL" not in _os.environ:
    _os.environ["MUJOCO_GL"] = "egl"
    _os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
