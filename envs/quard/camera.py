"""The onboard camera: RGB (+ depth) from MuJoCo's offscreen renderer, depth and segmentation by rays.

``MujocoCamera`` renders the ``front`` camera (on the base, ``CameraConfig.pos`` ahead of its centre,
looking forward along the base x axis, vertical field of view ``fovy``) of each requested env, one env
after the other on the calling thread: one OpenGL context per process (a collection worker is a
process), no threads sharing it. Shadows, reflections and multisampling are off: MuJoCo's defaults
cost ~200 ms a frame on a CPU (shadow maps), these settings ~10 ms (docs/quard.md).

Per-env colours: the compiled model is shared by many envs, so the colourable geoms' ``geom_rgba`` is
written just before each env's frame (a few hundred bytes; the physics never reads it).

Depth comes from the renderer's depth buffer (metres) or, with ``depth_source="rays"``, from
``mujoco.mj_multiRay``; segmentation (the geom hit per pixel) always from rays, so it needs no OpenGL.

A GPU backend supplies its own camera behind the same two calls (``render``, ``segment``) through
``backend.make_camera(cfg)``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import mujoco
import numpy as np

from quadforge.envs.quard.objects import CAMERA_NAME

MAX_RESOLUTION = 224


@dataclass
class CameraConfig:
    width: int = 64
    height: int = 64
    fovy: float = 60.0                 # degrees, vertical field of view
    pos: tuple[float, float, float] = (0.3, 0.0, 0.0)  # m in the base frame: 0.3 m ahead of its centre
    depth: bool = False                # also emit images/front_depth (float32 metres)
    depth_source: str = "gl"           # "gl": the renderer's depth buffer; "rays": mj_multiRay
    max_depth: float = 10.0            # m; rays that hit nothing (sky) read this

    def validate(self) -> "CameraConfig":
        for name in ("width", "height"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 8 <= v <= MAX_RESOLUTION:
                raise ValueError(f"camera.{name}={v!r}; allowed: an integer in [8, {MAX_RESOLUTION}]")
        if not 10.0 <= self.fovy <= 150.0:
            raise ValueError(f"camera.fovy={self.fovy!r}; allowed: 10..150 degrees")
        if self.depth_source not in ("gl", "rays"):
            raise ValueError(f"camera.depth_source={self.depth_source!r}; allowed: 'gl', 'rays'")
        return self


def gl_error(err: BaseException) -> RuntimeError:
    """The one-line error for a machine where MuJoCo cannot open an OpenGL context."""
    current = os.environ.get("MUJOCO_GL")
    return RuntimeError(
        f"QUARD camera: MuJoCo offscreen rendering failed with MUJOCO_GL={current!r} "
        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); set MUJOCO_GL=egl (EGL, "
        "headless GPU or Mesa) or MUJOCO_GL=osmesa (software) before starting Python, or run without "
        "images (QuardConfig.images=False)")


def make_renderer(model: mujoco.MjModel, height: int, width: int):
    """``mujoco.Renderer`` with the project's fast settings; a clear error naming MUJOCO_GL on failure."""
    # MUJOCO_GL is read when mujoco is first imported; quadforge/__init__.py defaults it to "egl"
    display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    context = getattr(mujoco, "GLContext", None)
    if context is None:
        # MUJOCO_GL=disable (e.g. a GPU machine rendering through MuJoCo Warp only): mujoco has no GL context
        raise gl_error(RuntimeError("mujoco was imported without OpenGL (no mujoco.GLContext)"))
    if context.__module__ == "mujoco.glfw" and not display:
        # GLFW without a display aborts the whole process (no exception to catch): say why first
        raise gl_error(RuntimeError("mujoco chose GLFW, which needs a display: it was imported before "
                                    "quadforge with MUJOCO_GL unset"))
    try:
        renderer = mujoco.Renderer(model, height, width)
    except Exception as err:  # ImportError, RuntimeError, mujoco.FatalError ... from the GL stack
        raise gl_error(err) from err
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    return renderer


class MujocoCamera:
    """Batched frames of the ``front`` camera for the envs of a ``mujoco_cpu`` backend."""

    def __init__(self, models: list[mujoco.MjModel], datas: list[mujoco.MjData], cfg: CameraConfig):
        self.cfg = cfg.validate()
        self.models, self.datas = models, datas
        self.model = models[0]
        self.cam_id = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, CAMERA_NAME)
        if self.cam_id < 0:
            raise ValueError(f"the scene has no camera named {CAMERA_NAME!r} (build it with the QUARD object library)")
        self._renderer = None
        self._depth_renderer = None
        self.colour_geoms = np.zeros(0, dtype=np.int64)
        self.env_rgba: np.ndarray | None = None   # (N, G, 4) per env, set by the task
        self._ray_dirs_cam = self._pixel_rays()
        self._depth_raw: np.ndarray | None = None

    # -------------------------------------------------------------------- colours
    def set_colour_geoms(self, geom_ids: np.ndarray, env_rgba: np.ndarray) -> None:
        """Geoms whose colour is per env, and the (N, G, 4) rgba every env gives them (kept by reference)."""
        self.colour_geoms = np.asarray(geom_ids, dtype=np.int64)
        self.env_rgba = env_rgba

    def _apply_colours(self, i: int) -> None:
        if self.env_rgba is not None and len(self.colour_geoms):
            self.model.geom_rgba[self.colour_geoms] = self.env_rgba[i]

    # -------------------------------------------------------------------- frames
    @property
    def renderer(self):
        if self._renderer is None:
            self._renderer = make_renderer(self.model, self.cfg.height, self.cfg.width)
        return self._renderer

    def render(self, env_ids, out_rgb: np.ndarray, out_depth: np.ndarray | None = None) -> None:
        """Write the frames of ``env_ids`` into ``out_rgb[i]`` ((N, H, W, 3) uint8) and, if given,
        ``out_depth[i]`` ((N, H, W) float32 m)."""
        r = self.renderer
        for i in np.asarray(env_ids, dtype=np.int64).reshape(-1):
            i = int(i)
            self._apply_colours(i)
            r.update_scene(self.datas[i], camera=self.cam_id)
            r.render(out=out_rgb[i])
            if out_depth is not None:
                if self.cfg.depth_source == "rays":
                    out_depth[i] = np.minimum(self.ray_depth(i), self.cfg.max_depth)
                else:
                    self._gl_depth(r, out_depth[i])
                    np.minimum(out_depth[i], self.cfg.max_depth, out=out_depth[i])

    def _gl_depth(self, r, out: np.ndarray) -> None:
        """The depth (m) of the frame just rendered, read from the same pass's depth buffer (a second
        ``render`` in depth mode would draw the scene again). Uses the renderer's context and viewport;
        a renderer without them (another MuJoCo version) falls back to its own depth pass."""
        ctx, rect = getattr(r, "_mjr_context", None), getattr(r, "_rect", None)
        if ctx is None or rect is None:
            r.enable_depth_rendering()
            try:
                r.render(out=out)
            finally:
                r.disable_depth_rendering()
            return
        raw = self._depth_raw
        if raw is None or raw.shape != out.shape:
            raw = self._depth_raw = np.empty(out.shape, dtype=np.float32)
        mujoco.mjr_readPixels(None, raw, rect, ctx)
        # reversed-Z perspective depth (the renderer's mjDEPTH_ZEROFAR) back to metres, as
        # mujoco.Renderer does it; rows come bottom-up from OpenGL
        extent = self.model.stat.extent
        znear = np.float32(self.model.vis.map.znear * extent)
        zfar = np.float32(self.model.vis.map.zfar * extent)
        c = np.float32(-0.5) * (-(zfar + znear) / (zfar - znear)) - np.float32(0.5)
        d = np.float32(-0.5) * (-(np.float32(2) * zfar * znear) / (zfar - znear))
        out[:] = (d / (raw.astype(np.float64) + c))[::-1]

    # -------------------------------------------------------------------- rays (no OpenGL)
    def _pixel_rays(self) -> np.ndarray:
        """(H*W, 3) unit ray directions in the camera frame (x right, y up, -z forward), row-major from
        the top-left pixel, for a pinhole with the configured vertical field of view."""
        h, w = self.cfg.height, self.cfg.width
        f = 0.5 * h / math.tan(math.radians(self.cfg.fovy) / 2)
        u = (np.arange(w) + 0.5 - w / 2) / f
        v = (h / 2 - (np.arange(h) + 0.5)) / f
        uu, vv = np.meshgrid(u, v)
        dirs = np.stack([uu, vv, -np.ones_like(uu)], axis=-1).reshape(-1, 3)
        return dirs / np.linalg.norm(dirs, axis=1, keepdims=True)

    def _cast(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        m, d = self.models[i], self.datas[i]
        pos = d.cam_xpos[self.cam_id].copy()
        rot = d.cam_xmat[self.cam_id].reshape(3, 3)
        vec = np.ascontiguousarray((self._ray_dirs_cam @ rot.T).reshape(-1))
        n = len(self._ray_dirs_cam)
        geom = np.full(n, -1, dtype=np.int32)
        dist = np.full(n, -1.0)
        base = int(m.cam_bodyid[self.cam_id])   # do not see the robot's own trunk
        mujoco.mj_multiRay(m, d, pos, vec, None, 1, base, geom, dist, None, n, self.cfg.max_depth * 10)
        return geom, dist

    def segment(self, i: int) -> np.ndarray:
        """(H, W) int32 geom id seen at every pixel of env ``i`` (-1: nothing)."""
        geom, _ = self._cast(int(i))
        return geom.reshape(self.cfg.height, self.cfg.width)

    def ray_depth(self, i: int) -> np.ndarray:
        """(H, W) float32 distance along the optical axis (m) per pixel of env ``i`` (inf: nothing)."""
        geom, dist = self._cast(int(i))
        along = dist * -self._ray_dirs_cam[:, 2]     # range -> depth along the optical axis
        along = np.where(geom >= 0, along, np.inf)
        return along.reshape(self.cfg.height, self.cfg.width).astype(np.float32)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
