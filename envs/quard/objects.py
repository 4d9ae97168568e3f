"""The QUARD object library: every object any family can place, written from MuJoCo primitives.

One compiled model serves every env and every family, so the library holds a fixed set of *instances*
(mocap bodies: two of each object kind, the obstacle, two balls, one box per letter, one tunnel per
shape). An episode places the instances it uses in front of the robot (``MjData.mocap_pos``, per env)
and parks the rest far away under the ground; per-env colours are applied when a frame is rendered
(``geom_rgba`` of the colourable geoms, see ``envs.quard.camera``), so nothing is recompiled.

Collisions: objects collide with the robot only (robot geoms get contype bit 2, objects contype 0 /
conaffinity 2), never with the ground or with each other, so a parked or overlapping object costs
nothing. Objects are kinematic: the rolling ball of ``stop`` is moved by the task every step.

Shapes (m): cube 0.5; chair (seat 0.45 at 0.45 high, four legs, back); table (0.8 x 0.5 top at 0.7,
four legs); trashcan (cylinder r 0.22, h 0.6, lid, handle); sofa (0.9 wide seat, back, arms); barrel
(cylinder r 0.25, h 0.8, two hoops); obstacle (a 0.8 m wide, 0.45 m high fence panel on two posts);
ball r 0.2; letter box 0.5 with the letter on every face (cube texture generated here from a 5 x 7
glyph); rectangle tunnel 1 m long, 0.9 m wide, roof at 0.6 m; triangle tunnel of two plates at +-30
degrees from the vertical meeting over the axis (0.9 m wide at the ground).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import mujoco
import numpy as np

from quadforge.envs.quard.words import COLOURS, LETTERS, OBJECTS, TUNNEL_SHAPES

RGB: dict[str, tuple[float, float, float]] = {
    "blue": (0.10, 0.30, 0.95), "green": (0.10, 0.70, 0.20), "red": (0.90, 0.10, 0.10),
    "yellow": (0.95, 0.85, 0.10), "gold": (0.80, 0.62, 0.20), "orange": (1.00, 0.45, 0.00),
    "pink": (1.00, 0.50, 0.75), "purple": (0.50, 0.15, 0.75),
}
assert set(RGB) == set(COLOURS)
NEUTRAL = (0.55, 0.55, 0.55)      # obstacle, marker balls, letter boxes' tint
PARK = np.array([-100.0, 0.0, -10.0])  # where unused instances wait (below the ground, no collisions)
BALL_RADIUS = 0.2
CUBE_SIZE = 0.5
TUNNEL_LENGTH, TUNNEL_WIDTH, TUNNEL_ROOF = 1.0, 0.9, 0.6
TRIANGLE_ANGLE = math.radians(30.0)   # plates from the vertical
OBJECT_COPIES = 2                 # instances per object kind: target and distractor may share a kind
OBSTACLE_SENSOR = "quard_obstacle_contact"
CAMERA_NAME = "front"

# 5 x 7 glyphs of the letters (drawn here), '#' = ink
_GLYPHS = {
    "a": (".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"),
    "b": ("####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."),
    "c": (".####", "#....", "#....", "#....", "#....", "#....", ".####"),
    "d": ("####.", "#...#", "#...#", "#...#", "#...#", "#...#", "####."),
    "e": ("#####", "#....", "#....", "####.", "#....", "#....", "#####"),
    "f": ("#####", "#....", "#....", "####.", "#....", "#....", "#...."),
}
assert set(_GLYPHS) == set(LETTERS)


def letter_image(letter: str, size: int = 64) -> np.ndarray:
    """(size, size, 3) uint8: the letter's glyph in black on a light square."""
    rows = _GLYPHS[letter]
    glyph = np.array([[c == "#" for c in row] for row in rows], dtype=bool)   # (7, 5)
    cell = max(1, (size * 3 // 4) // 7)
    big = np.kron(glyph, np.ones((cell, cell), dtype=bool))
    img = np.full((size, size, 3), 235, dtype=np.uint8)
    top, left = (size - big.shape[0]) // 2, (size - big.shape[1]) // 2
    img[top:top + big.shape[0], left:left + big.shape[1]][big] = 15
    return img


@dataclass
class Instance:
    """One placeable object: a mocap body and its geoms."""

    name: str                      # body name
    kind: str                      # "object", "obstacle", "ball", "letter", "tunnel"
    variant: str                   # object kind, letter, tunnel shape ("" for obstacle / ball)
    geoms: list[str] = field(default_factory=list)
    shades: list[float] = field(default_factory=list)  # per geom: colour multiplier (legs darker, ...)
    textured: list[bool] = field(default_factory=list)  # per geom: keeps its own texture colours
    mocap: int = -1                # filled by bind()
    geom_ids: np.ndarray | None = None


def _quat_x(angle: float) -> list[float]:
    return [math.cos(angle / 2), math.sin(angle / 2), 0.0, 0.0]


class ObjectLibrary:
    """The scene addon (``BackendConfig.scene_addon``) of the QUARD tasks; ``bind(model)`` after compiling."""

    def __init__(self, camera_fovy: float = 60.0, camera_pos: tuple[float, float, float] = (0.3, 0.0, 0.0),
                 copies: int = OBJECT_COPIES):
        self.camera_fovy, self.camera_pos, self.copies = float(camera_fovy), tuple(camera_pos), int(copies)
        self.instances: list[Instance] = []
        self.index: dict[tuple[str, str, int], int] = {}   # (kind, variant, copy) -> instance index
        self.sensors: dict[str, slice] = {}

    # ------------------------------------------------------------------ building
    def add_to(self, spec: mujoco.MjSpec, first_sensor: int) -> dict[str, slice]:
        from quadforge.envs.scene import GROUND_NAME

        self.instances.clear()
        self.index.clear()
        for g in spec.geoms:   # the robot's colliding geoms also collide with objects (bit 2)
            if g.name != GROUND_NAME and g.contype:
                g.contype = int(g.contype) | 2
        self._visuals(spec)
        robot = spec.body("base")
        robot.add_camera(name=CAMERA_NAME, pos=list(self.camera_pos), xyaxes=[0, -1, 0, 0, 0, 1],
                         fovy=self.camera_fovy)
        for kind in OBJECTS:
            for c in range(self.copies):
                self._object(spec, kind, c)
        self._obstacle(spec)
        for c in range(2):
            inst = self._new(spec, "ball", "", c)
            self._geom(inst, mujoco.mjtGeom.mjGEOM_SPHERE, [BALL_RADIUS], [0, 0, BALL_RADIUS])
        for letter in LETTERS:
            self._letter(spec, letter)
        for shape in TUNNEL_SHAPES:
            self._tunnel(spec, shape)
        s = spec.add_sensor(type=mujoco.mjtSensor.mjSENS_CONTACT, objtype=mujoco.mjtObj.mjOBJ_BODY,
                            objname="quard_obstacle_0")
        s.name = OBSTACLE_SENSOR
        s.intprm[0], s.intprm[1], s.intprm[2] = 1 << int(mujoco.mjtConDataField.mjCONDATA_FORCE), 3, 1
        self.sensors = {OBSTACLE_SENSOR: slice(first_sensor, first_sensor + 3)}
        return dict(self.sensors)

    def _visuals(self, spec: mujoco.MjSpec) -> None:
        from quadforge.envs.scene import GROUND_NAME

        # cheap rendering: no shadows, no reflections, no multisampling (MuJoCo's defaults cost ~20x)
        spec.visual.quality.offsamples = 0
        spec.visual.quality.shadowsize = 0
        # the parked objects (100 m away) would make MuJoCo's automatic extent ~100 m and its near
        # clipping plane (znear x extent) ~1 m, cutting the ground in front of the camera away
        spec.stat.extent = 5.0
        spec.visual.map.znear = 0.01
        spec.visual.headlight.ambient = [0.45, 0.45, 0.45]
        spec.visual.headlight.diffuse = [0.5, 0.5, 0.5]
        spec.worldbody.add_light(name="quard_sun", pos=[0, 0, 6], dir=[0.3, 0.2, -1],
                                 type=int(mujoco.mjtLightType.mjLIGHT_DIRECTIONAL), castshadow=0, diffuse=[0.45, 0.45, 0.45])
        sky = spec.add_texture(name="quard_sky", type=mujoco.mjtTexture.mjTEXTURE_SKYBOX,
                               builtin=mujoco.mjtBuiltin.mjBUILTIN_GRADIENT, width=64, height=64,
                               rgb1=[0.55, 0.70, 0.90], rgb2=[0.92, 0.93, 0.96])
        del sky
        tex = spec.add_texture(name="quard_ground", type=mujoco.mjtTexture.mjTEXTURE_2D,
                               builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER, width=64, height=64,
                               rgb1=[0.42, 0.40, 0.36], rgb2=[0.48, 0.46, 0.42])
        mat = spec.add_material(name="quard_ground", texrepeat=[1, 1], texuniform=True, reflectance=0.0)
        mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = tex.name
        for g in spec.geoms:
            if g.name == GROUND_NAME:
                g.material = mat.name

    def _new(self, spec: mujoco.MjSpec, kind: str, variant: str, copy: int) -> Instance:
        name = f"quard_{kind}{'_' + variant if variant else ''}_{copy}"
        spec.worldbody.add_body(name=name, mocap=True, pos=PARK.tolist())
        inst = Instance(name=name, kind=kind, variant=variant)
        inst.body = spec.body(name)  # type: ignore[attr-defined]
        self.index[(kind, variant, copy)] = len(self.instances)
        self.instances.append(inst)
        return inst

    def _geom(self, inst: Instance, gtype, size, pos, quat=None, shade: float = 1.0, material: str | None = None):
        gname = f"{inst.name}_g{len(inst.geoms)}"
        g = inst.body.add_geom(name=gname, type=gtype, size=list(size), pos=list(pos), contype=0, conaffinity=2,
                               rgba=[*NEUTRAL, 1.0])  # type: ignore[attr-defined]
        if quat is not None:
            g.quat = list(quat)
        if material is not None:
            g.material = material
        inst.geoms.append(gname)
        inst.shades.append(shade)
        inst.textured.append(material is not None)
        return g

    def _object(self, spec: mujoco.MjSpec, kind: str, copy: int) -> None:
        box, cyl, cap = mujoco.mjtGeom.mjGEOM_BOX, mujoco.mjtGeom.mjGEOM_CYLINDER, mujoco.mjtGeom.mjGEOM_CAPSULE
        inst = self._new(spec, "object", kind, copy)
        leg = 0.6
        if kind == "cube":
            self._geom(inst, box, [CUBE_SIZE / 2] * 3, [0, 0, CUBE_SIZE / 2])
        elif kind == "chair":
            self._geom(inst, box, [0.23, 0.23, 0.03], [0, 0, 0.45])
            for sx in (-1, 1):
                for sy in (-1, 1):
                    self._geom(inst, cyl, [0.025, 0.21], [0.19 * sx, 0.19 * sy, 0.21], shade=leg)
            self._geom(inst, box, [0.03, 0.23, 0.25], [0.2, 0, 0.73])     # back, away from the robot
        elif kind == "table":
            self._geom(inst, box, [0.25, 0.4, 0.03], [0, 0, 0.7])
            for sx in (-1, 1):
                for sy in (-1, 1):
                    self._geom(inst, box, [0.03, 0.03, 0.34], [0.2 * sx, 0.35 * sy, 0.34], shade=leg)
        elif kind == "trashcan":
            self._geom(inst, cyl, [0.22, 0.3], [0, 0, 0.3])
            self._geom(inst, cyl, [0.24, 0.02], [0, 0, 0.62], shade=leg)
            self._geom(inst, cap, [0.02, 0.07], [0, 0, 0.68], quat=[math.cos(math.pi / 4), math.sin(math.pi / 4), 0, 0],
                       shade=leg)
        elif kind == "sofa":
            self._geom(inst, box, [0.25, 0.45, 0.12], [0, 0, 0.2])
            self._geom(inst, box, [0.08, 0.45, 0.25], [0.22, 0, 0.45])
            for sy in (-1, 1):
                self._geom(inst, box, [0.25, 0.07, 0.18], [0, 0.45 * sy, 0.3], shade=0.8)
            for sy in (-1, 1):
                self._geom(inst, box, [0.04, 0.04, 0.04], [-0.18, 0.38 * sy, 0.04], shade=leg)
        elif kind == "barrel":
            self._geom(inst, cyl, [0.25, 0.4], [0, 0, 0.4])
            for z in (0.2, 0.6):
                self._geom(inst, cyl, [0.265, 0.03], [0, 0, z], shade=leg)
        else:
            raise ValueError(f"unknown object kind {kind!r}; allowed: {', '.join(OBJECTS)}")

    def _obstacle(self, spec: mujoco.MjSpec) -> None:
        box, cyl = mujoco.mjtGeom.mjGEOM_BOX, mujoco.mjtGeom.mjGEOM_CYLINDER
        inst = self._new(spec, "obstacle", "", 0)
        self._geom(inst, box, [0.04, 0.4, 0.16], [0, 0, 0.29])
        for sy in (-1, 1):
            self._geom(inst, cyl, [0.04, 0.25], [0, 0.42 * sy, 0.25], shade=0.6)

    def _letter(self, spec: mujoco.MjSpec, letter: str) -> None:
        size = 64
        # a cube texture: six square faces stacked; MuJoCo lays a face image on a vertical box face a
        # quarter turn from upright and flipped, so the glyph is flipped and turned back first
        # (checked by eye on A and F in docs/quard_frames.png: the letters read upright from the robot)
        face = np.rot90(np.fliplr(np.flipud(letter_image(letter, size))), 1)
        tex = spec.add_texture(name=f"quard_letter_{letter}", type=mujoco.mjtTexture.mjTEXTURE_CUBE,
                               width=size, height=6 * size, nchannel=3)
        tex.data = np.ascontiguousarray(np.concatenate([face] * 6, axis=0)).tobytes()
        mat = spec.add_material(name=f"quard_letter_{letter}")
        mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = tex.name
        inst = self._new(spec, "letter", letter, 0)
        self._geom(inst, mujoco.mjtGeom.mjGEOM_BOX, [CUBE_SIZE / 2] * 3, [0, 0, CUBE_SIZE / 2], material=mat.name)

    def _tunnel(self, spec: mujoco.MjSpec, shape: str) -> None:
        box = mujoco.mjtGeom.mjGEOM_BOX
        inst = self._new(spec, "tunnel", shape, 0)
        half_l, half_w, t = TUNNEL_LENGTH / 2, TUNNEL_WIDTH / 2, 0.02
        if shape == "rectangle":
            for sy in (-1, 1):
                self._geom(inst, box, [half_l, t, TUNNEL_ROOF / 2], [0, sy * (half_w + t), TUNNEL_ROOF / 2])
            self._geom(inst, box, [half_l, half_w + 2 * t, t], [0, 0, TUNNEL_ROOF + t], shade=0.8)
        elif shape == "triangle":
            slant = half_w / math.sin(TRIANGLE_ANGLE)   # plate length from ground to apex
            for sy in (-1, 1):
                # a plate leaning in from y = sy * half_w at the ground to the apex over the axis
                centre = [0, sy * half_w / 2, slant * math.cos(TRIANGLE_ANGLE) / 2]
                self._geom(inst, box, [half_l, t, slant / 2], centre, quat=_quat_x(sy * TRIANGLE_ANGLE),
                           shade=1.0 if sy > 0 else 0.85)
        else:
            raise ValueError(f"unknown tunnel shape {shape!r}; allowed: {', '.join(TUNNEL_SHAPES)}")

    # ------------------------------------------------------------------ after compiling
    def bind(self, model: mujoco.MjModel) -> "ObjectLibrary":
        """Look up the compiled ids (mocap index, geom ids) of every instance."""
        for inst in self.instances:
            body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, inst.name)
            inst.mocap = int(model.body_mocapid[body])
            inst.geom_ids = np.array([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in inst.geoms])
        self.num_mocap = int(model.nmocap)
        self.body_ids = np.array([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, i.name) for i in self.instances])
        return self

    def find(self, kind: str, variant: str = "", copy: int = 0) -> int:
        return self.index[(kind, variant, copy)]

    def instance_of_body(self, model: mujoco.MjModel) -> np.ndarray:
        """(nbody,) instance index of every body, -1 for bodies that are not objects."""
        out = np.full(model.nbody, -1, dtype=np.int64)
        out[self.body_ids] = np.arange(len(self.instances))
        return out
