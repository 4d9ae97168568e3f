"""Named observation terms and the layouts that flatten them into a policy's input vector.

The env produces raw, unscaled terms (SI units, body frame); the store keeps them raw; every policy
declares an ``ObsLayout`` - which terms, which slice, what offset/scale/clip - so any model can choose
its own input later. The catalogue of term names and widths is ``quadforge.terms``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch

from quadforge.tensors import device_constant
from quadforge.typed_values import is_whole

# the catalogue lives in quadforge.terms (no torch); its names are this module's too
from quadforge.terms import (COMMAND_NAMES, HEIGHT_SCAN_X, HEIGHT_SCAN_Y, JOINT_NAMES, LEGS, NUM_FEET,  # noqa: F401
                             NUM_JOINTS, PRIVILEGED_TERMS, TASK_TERM_PREFIX, TERM_DIMS)


@dataclass(frozen=True)
class LayoutTerm:
    """One term of a layout: ``clip((x[index] + offset) * scale)``."""

    name: str
    scale: float | Sequence[float] = 1.0
    index: tuple[int, ...] | None = None   # a sub-selection of the term's entries
    offset: float = 0.0
    clip: float | None = None

    def __post_init__(self) -> None:
        # checked here, not at build(): a wrong scale length or index would otherwise give a layout whose
        # .dim disagrees with what build() makes, or an index error deep inside torch at the first batch
        if self.name not in TERM_DIMS:
            raise ValueError(f"unknown observation term {self.name!r}; known terms: {sorted(TERM_DIMS)}")
        width = TERM_DIMS[self.name]
        if self.index is not None:
            if len(self.index) == 0 or not all(is_whole(i) and 0 <= i < width for i in self.index):
                raise ValueError(f"layout term {self.name!r}: index={tuple(self.index)!r}; entries must be whole "
                                 f"numbers in 0..{width - 1} (the term has {width} entries)")
        if isinstance(self.scale, numbers.Real) and not isinstance(self.scale, bool):
            return
        values = list(self.scale) if isinstance(self.scale, Iterable) and not isinstance(self.scale, str) else None
        if values is None or len(values) != self.dim \
                or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            raise ValueError(f"layout term {self.name!r}: scale={self.scale!r}; give one number or {self.dim} "
                             f"numbers (one per entry{' of index' if self.index is not None else ''})")

    @property
    def dim(self) -> int:
        return len(self.index) if self.index is not None else TERM_DIMS[self.name]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        if self.index is not None:
            x = x.index_select(-1, device_constant(self.index, torch.long, x.device))
        # a scalar scale stays a Python number (no tensor to make); a per-entry one is made once per device
        scale = (float(self.scale) if isinstance(self.scale, numbers.Real)
                 else device_constant(tuple(self.scale), x.dtype, x.device))
        y = (x + self.offset) * scale
        if self.clip is not None:
            y = y.clamp(-self.clip, self.clip)
        return y


@dataclass(frozen=True)
class ObsLayout:
    name: str
    terms: tuple[LayoutTerm, ...]
    clip: float | None = None

    @property
    def dim(self) -> int:
        return sum(t.dim for t in self.terms)

    @property
    def term_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.name for t in self.terms))

    @property
    def privileged(self) -> bool:
        return any(t.name in PRIVILEGED_TERMS for t in self.terms)

    def build(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Flatten named terms (..., term_dim) into (..., self.dim)."""
        missing = [t.name for t in self.terms if t.name not in terms]
        if missing:
            raise KeyError(f"layout {self.name!r} needs observation terms {missing}; got {sorted(terms)}")
        out = torch.cat([t.apply(terms[t.name]) for t in self.terms], dim=-1)
        return out.clamp(-self.clip, self.clip) if self.clip is not None else out

    def to_dict(self) -> dict:
        return {"name": self.name, "clip": self.clip, "terms": [
            {"name": t.name, "scale": list(t.scale) if isinstance(t.scale, (list, tuple)) else t.scale,
             "index": list(t.index) if t.index is not None else None, "offset": t.offset, "clip": t.clip}
            for t in self.terms]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ObsLayout":
        terms = tuple(LayoutTerm(name=t["name"], scale=tuple(t["scale"]) if isinstance(t["scale"], list) else t["scale"],
                                 index=tuple(t["index"]) if t.get("index") is not None else None,
                                 offset=t.get("offset", 0.0), clip=t.get("clip")) for t in d["terms"])
        return cls(name=d["name"], terms=terms, clip=d.get("clip"))


# --- the named layouts -------------------------------------------------------------------------------
_VEL3 = (0, 1, 2)

LEGGED_GYM_48 = ObsLayout("legged_gym_48", (
    LayoutTerm("base_lin_vel", 2.0),
    LayoutTerm("base_ang_vel", 0.25),
    LayoutTerm("projected_gravity"),
    LayoutTerm("commands", (2.0, 2.0, 0.25), index=_VEL3),
    LayoutTerm("dof_pos"),
    LayoutTerm("dof_vel", 0.05),
    LayoutTerm("last_action"),
), clip=100.0)

LEGGED_GYM_235 = ObsLayout("legged_gym_235", LEGGED_GYM_48.terms + (
    LayoutTerm("height_scan", 5.0, offset=-0.5, clip=5.0),
), clip=100.0)

# FCNet appendix C.3.1 (the paper lists 12-D angular velocity and a 16-D command; the body angular
# velocity is 3-D and our gait-conditioned command is 15-D - the walk-these-ways space).
FCNET = ObsLayout("fcnet", (
    LayoutTerm("projected_gravity"),
    LayoutTerm("dof_vel", 0.05),
    LayoutTerm("dof_pos_sin"),
    LayoutTerm("dof_pos_cos"),
    LayoutTerm("base_ang_vel", 0.25),
    LayoutTerm("last_action"),
    LayoutTerm("commands"),
))

# walk-these-ways' 70-D frame: gravity 3, commands 15, dof pos 12, dof vel 12, action 12,
# previous action 12, clock 4 (stacked over 30 frames by its adapter).
WTW_70 = ObsLayout("wtw_70", (
    LayoutTerm("projected_gravity"),
    LayoutTerm("commands"),
    LayoutTerm("dof_pos"),
    LayoutTerm("dof_vel", 0.05),
    LayoutTerm("last_action"),
    LayoutTerm("last_last_action"),
    LayoutTerm("gait_clock"),
))

# The default for models trained here: proprioception + command, no privileged terms.
PROPRIO = ObsLayout("proprio", (
    LayoutTerm("base_ang_vel", 0.25),
    LayoutTerm("projected_gravity"),
    LayoutTerm("commands"),
    LayoutTerm("dof_pos"),
    LayoutTerm("dof_vel", 0.05),
    LayoutTerm("last_action"),
    LayoutTerm("gait_clock"),
))

LAYOUTS: dict[str, ObsLayout] = {l.name: l for l in (LEGGED_GYM_48, LEGGED_GYM_235, FCNET, WTW_70, PROPRIO)}


def get_layout(name: str) -> ObsLayout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown observation layout {name!r}; allowed: {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def as_layout(layout: ObsLayout | str, who: str = "layout") -> ObsLayout:
    """An ``ObsLayout`` as is, a registered layout's name resolved (``get_layout``); anything else an error."""
    if isinstance(layout, ObsLayout):
        return layout
    if isinstance(layout, str):
        return get_layout(layout)
    raise ValueError(f"{who}: layout must be an ObsLayout or a layout name ({', '.join(sorted(LAYOUTS))}), "
                     f"got {type(layout).__name__}")
