"""A short GIF of env 0 during an evaluation (``quadforge eval --video``).

MuJoCo's offscreen ``Renderer`` on env 0's own ``MjModel``/``MjData`` of the ``mujoco_cpu`` backend, a
camera tracking the base, shadows and reflections off (cheap, and headless EGL often lacks them).
``prepare_gl()`` must run before ``mujoco`` is first imported (MuJoCo picks its GL backend at import): it
defaults ``MUJOCO_GL`` to ``egl`` and Mesa's ``EGL_PLATFORM`` to ``surfaceless`` (headless, no display
or GPU needed). When rendering is unavailable (no GL, another backend)
``try_create`` says why and returns None: the evaluation runs on without a video. Frames are taken
every other control step (25 fps) and written with Pillow.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np


def prepare_gl() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("EGL_PLATFORM", "surfaceless")


class VideoRecorder:
    def __init__(self, model: Any, data: Any, max_steps: int, width: int = 320, height: int = 240):
        import mujoco

        self._mujoco = mujoco
        self.data = data
        self.renderer = mujoco.Renderer(model, height=height, width=width)
        scene = self.renderer.scene
        scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        self.camera = mujoco.MjvCamera()
        self.camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        self.camera.trackbodyid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "base")
        self.camera.distance, self.camera.elevation, self.camera.azimuth = 1.8, -20.0, 135.0
        self.max_steps = max_steps
        self.steps = 0
        self.frames: list[np.ndarray] = []

    @classmethod
    def try_create(cls, env: Any, max_steps: int, log: Callable[[str], None] = print) -> "VideoRecorder | None":
        backend = getattr(env, "backend", None)
        if not hasattr(backend, "models") or not hasattr(backend, "datas"):
            log(f"video: skipped - backend {type(backend).__name__} exposes no MuJoCo models to render")
            return None
        try:
            return cls(backend.models[0], backend.datas[0], max_steps)
        except Exception as err:  # no GL context, missing EGL, ...: evaluation goes on without video
            log(f"video: rendering unavailable (MUJOCO_GL={os.environ.get('MUJOCO_GL')}: "
                f"{type(err).__name__}: {err}); skipped")
            return None

    def capture(self, _terms: Mapping[str, Any]) -> None:
        """Called before each ``act``: the scene the policy is about to act on."""
        if self.steps < self.max_steps and self.steps % 2 == 0:
            self.renderer.update_scene(self.data, camera=self.camera)
            self.frames.append(self.renderer.render().copy())
        self.steps += 1

    def save(self, out_dir: Path) -> Path | None:
        if not self.frames:
            return None
        from PIL import Image

        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "episode.gif"
        images = [Image.fromarray(f) for f in self.frames]
        images[0].save(path, save_all=True, append_images=images[1:], duration=40, loop=0)
        self.renderer.close()
        return path
