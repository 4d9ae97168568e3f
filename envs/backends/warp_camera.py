"""``WarpCamera``: the ``front`` camera of every world through MuJoCo Warp's batch renderer.

The same two calls as the CPU camera of the QUARD tasks (``render(env_ids, out_rgb, out_depth)``,
``segment(i)``, plus ``set_colour_geoms`` and ``close``), obtained through ``backend.make_camera(cfg)``.
MuJoCo Warp ray-traces every world in one call (``refit_bvh`` + ``render`` over a render context built
once with ``create_render_context``). Shadows are off, as on the CPU camera; textures and the skybox are
on, as on the CPU camera, so the two cameras' frames agree within a few levels (tested): a VLA trained on
CPU frames reads Warp's. (With them off, Warp drew a black sky, a white ground and blank letter boxes,
151 levels off on average, and the shipped RT-1 VLA timed out on go_to where it succeeded on the CPU.) The camera
itself comes from the scene's MJCF (a camera named ``front`` on the base); its field of view is the
MJCF's. Frames land on the backend's device; ``render`` copies the requested rows into the caller's
numpy arrays (the store keeps images on the host anyway).

Per-env colours: ``set_colour_geoms`` gives ``geom_rgba`` a leading world dimension the first time it
is called (the renderer reads ``geom_rgba[world % rows]``), then writes each env's colours there.
"""
from __future__ import annotations

import numpy as np
import torch

CAMERA_NAME = "front"


class WarpCamera:
    def __init__(self, backend, cfg):
        import mujoco

        self.backend, self.cfg = backend, cfg.validate() if hasattr(cfg, "validate") else cfg
        self._wp, self._mjw = backend._wp, backend._mjw
        mjm = backend.mjm
        self.cam_id = mujoco.mj_name2id(mjm, mujoco.mjtObj.mjOBJ_CAMERA, CAMERA_NAME)
        if self.cam_id < 0:
            raise ValueError(f"mujoco_warp camera: the scene has no camera named {CAMERA_NAME!r} "
                             f"(build it with a scene that adds one, e.g. the QUARD object library)")
        self.height, self.width = int(cfg.height), int(cfg.width)
        self.depth = bool(getattr(cfg, "depth", False))
        self.max_depth = float(getattr(cfg, "max_depth", 10.0))
        n = backend.num_envs
        with backend._scope():
            self.rc = self._mjw.create_render_context(
                mjm, nworld=n, cam_res=(self.width, self.height), render_rgb=True, render_depth=self.depth,
                render_seg=True, use_textures=True, use_shadows=False, render_skybox=True,
                cam_active=[CAMERA_NAME])
            wp = self._wp
            self._rgb = wp.zeros((n, self.height, self.width), dtype=wp.vec3)
            self._depth = wp.zeros((n, self.height, self.width), dtype=float) if self.depth else None
            self._seg = wp.zeros((n, self.height, self.width), dtype=wp.vec2i)
        self._fresh = False
        self._colour_ids, self._env_rgba = None, None

    def set_colour_geoms(self, geom_ids: np.ndarray, env_rgba: np.ndarray) -> None:
        """Geoms whose colour is per env and the (N, G, 4) rgba every env gives them, kept by reference
        (as the CPU camera keeps it): each render uploads the colours the envs have then."""
        b, wp = self.backend, self._wp
        m = b.m
        if m.geom_rgba.shape[0] != b.num_envs:   # batch the colours per world once
            rows = np.repeat(m.geom_rgba.numpy()[:1], b.num_envs, axis=0)
            with b._scope():
                m.geom_rgba = wp.array(rows, dtype=wp.vec4)
        self._colour_ids = torch.as_tensor(np.asarray(geom_ids, dtype=np.int64), device=b.device)
        self._env_rgba = env_rgba
        self._upload_colours()

    def _upload_colours(self) -> None:
        if self._env_rgba is None:
            return
        b = self.backend
        rgba = self._wp.to_torch(b.m.geom_rgba)                           # (N, ngeom, 4)
        rgba[:, self._colour_ids] = torch.as_tensor(np.asarray(self._env_rgba, dtype=np.float32), device=b.device)

    def _render_all(self) -> None:
        b = self.backend
        self._upload_colours()
        with b._scope():
            self._mjw.refit_bvh(b.m, b.d, self.rc)
            self._mjw.render(b.m, b.d, self.rc)
            self._mjw.get_rgb(self.rc, 0, self._rgb)
            if self._depth is not None:
                # Warp writes depth / scale clamped to [0, 1]: scale by max_depth, multiply back in render
                self._mjw.get_depth(self.rc, 0, self.max_depth, self._depth)
            self._mjw.get_segmentation(self.rc, 0, self._seg)
        self._fresh = True

    def render(self, env_ids, out_rgb: np.ndarray, out_depth: np.ndarray | None = None) -> None:
        """Write the frames of ``env_ids`` into ``out_rgb[i]`` ((N, H, W, 3) uint8) and, if given,
        ``out_depth[i]`` ((N, H, W) float32 m). One call renders every world."""
        if out_depth is not None and self._depth is None:
            raise ValueError("mujoco_warp camera: depth was not enabled (CameraConfig.depth=True)")
        self._render_all()
        ids = torch.as_tensor(np.asarray(env_ids, dtype=np.int64).reshape(-1))
        rgb = self._wp.to_torch(self._rgb)                                # (N, H, W, 3) in [0, 1]
        frames = (rgb[ids.to(rgb.device)] * 255.0 + 0.5).clamp(0, 255).to(torch.uint8).cpu().numpy()
        out_rgb[ids.numpy()] = frames
        if out_depth is not None:
            depth = self._wp.to_torch(self._depth)[ids.to(rgb.device)] * self.max_depth
            # a ray that hits nothing reads 0 (or the clamp): max_depth, as on the CPU camera
            depth = torch.where(depth > 0, depth, torch.full_like(depth, self.max_depth))
            out_depth[ids.numpy()] = depth.cpu().numpy()

    def segment(self, i: int) -> np.ndarray:
        """(H, W) int32 geom id seen at every pixel of env ``i`` (-1: nothing), from the last ``render``
        (rendered now if none was)."""
        if not self._fresh:
            self._render_all()
        seg = self._wp.to_torch(self._seg)[int(i)]                         # (H, W, 2): (id, object type)
        return seg[..., 0].to(torch.int32).cpu().numpy()

    def close(self) -> None:
        self.rc = None
