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

Cube textures: MuJoCo Warp's ray tracer samples every texture as one 2D image spread over each box face,
where MuJoCo C shows a cube texture's own face image on each face. A cube texture is six faces stacked,
so Warp drew all six squeezed onto every face: the QUARD letter boxes showed stripes, and the shipped VLA
read distinguish's letters in 6 of 20 episodes on Warp against 19 of 20 on the CPU. A cube texture whose
six faces are one image (every QUARD letter) is therefore handed to the renderer as that one face, turned
the way MuJoCo C shows it on a vertical box face (``cube_face_as_shown``), filtered and dimmed to look as
the CPU camera draws it (``FACE_TEXELS``, ``FACE_BRIGHTNESS``); a cube texture with different faces is
left as it is, with a warning, since one 2D image cannot hold it.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

CAMERA_NAME = "front"
# How a one-image cube face is handed to MuJoCo Warp (module doc), chosen to match the CPU camera's frames:
# MuJoCo C minifies a texture through OpenGL mipmaps where Warp samples it bilinearly, and Warp draws a
# textured face brighter (its pixels saturate; untextured objects agree within 1.2 levels on go_to,
# go_through and go_avoid scenes, so only the texture path differs). On distinguish scenes (4 worlds,
# Warp's CPU device) the letter pixels' mean difference from the CPU camera was 56 levels with the stacked faces, 33 with the
# face alone, 12.7 with the face box-filtered to 16 texels and at 0.8 brightness (the best of 64 / 32 /
# 16 texels x 0.75 / 0.8 / 0.85 / 1.0); the shipped VLA then reads distinguish's letters in 55 of 60
# episodes on Warp against 59 of 60 on the CPU (38 of 60 with the face alone).
FACE_TEXELS = 16
FACE_BRIGHTNESS = 0.8


def cube_face_as_shown(face: np.ndarray) -> np.ndarray:
    """A cube texture's face image (rows top down, as stored) -> the picture MuJoCo C shows on a vertical
    box face, upright from outside: MuJoCo C lays the face a quarter turn from upright and flipped (the
    QUARD letters are stored turned the other way for it, ``envs.quard.objects``), MuJoCo Warp lays a 2D
    image upright."""
    return np.ascontiguousarray(np.flipud(np.fliplr(np.rot90(face, -1))))


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
            self._show_cube_faces(mjm)
            wp = self._wp
            self._rgb = wp.zeros((n, self.height, self.width), dtype=wp.vec3)
            self._depth = wp.zeros((n, self.height, self.width), dtype=float) if self.depth else None
            self._seg = wp.zeros((n, self.height, self.width), dtype=wp.vec2i)
        self._fresh = False
        self._colour_ids, self._env_rgba = None, None

    def _show_cube_faces(self, mjm) -> None:
        """Hand the renderer each one-image cube texture as its face, as MuJoCo C shows it (module doc)."""
        import mujoco

        wp = self._wp
        cubes = np.flatnonzero(mjm.tex_type == mujoco.mjtTexture.mjTEXTURE_CUBE)
        if not len(cubes):
            return
        if not hasattr(self.rc, "textures_registry"):   # a MuJoCo Warp whose render context is laid out otherwise
            warnings.warn("mujoco_warp camera: this MuJoCo Warp's render context has no textures_registry; "
                          "cube textures are drawn as it samples them (six faces squeezed onto each face)")
            return
        registry = list(self.rc.textures_registry)
        for tex_id in cubes:
            adr, h, w, c = (int(a[tex_id]) for a in (mjm.tex_adr, mjm.tex_height, mjm.tex_width, mjm.tex_nchannel))
            name = mujoco.mj_id2name(mjm, mujoco.mjtObj.mjOBJ_TEXTURE, int(tex_id))
            stacked = adr >= 0 and h == 6 * w           # six square faces, stored one under another
            faces = mjm.tex_data[adr: adr + h * w * c].reshape(6, w, w, c) if stacked else None
            if faces is None or not (faces == faces[:1]).all():
                warnings.warn(f"mujoco_warp camera: cube texture {name!r} is not six copies of one face; MuJoCo "
                              f"Warp's renderer shows one 2D image per texture, so it draws it squeezed")
                continue
            face = cube_face_as_shown(faces[0]).astype(np.float32)
            k = w // FACE_TEXELS if w % FACE_TEXELS == 0 else 1
            face = face.reshape(w // k, k, w // k, k, c).mean((1, 3)) * FACE_BRIGHTNESS
            rgba = np.ones((w // k, w // k, 4), dtype=np.float32)
            rgba[..., :c] = face / 255.0
            registry[tex_id] = wp.Texture2D(wp.array(rgba, dtype=float), filter_mode=wp.TextureFilterMode.LINEAR)
        self.rc.textures_registry = registry
        self.rc.textures = wp.array(registry, dtype=wp.Texture2D)

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
