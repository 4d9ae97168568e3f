"""Networks, their checkpoint files and action binning: what ``experts/`` (deployment) and ``training/``
(the trainers) both build on. The model list is ``models.registry`` (``MODEL_SPECS``).

``build_model(name, **config)`` builds an imitation sequence model (``models.base.SequenceModel``);
``model.config`` rebuilds the same one.
"""
from __future__ import annotations

from typing import Any

from quadforge.models.base import Cache, SequenceModel
from quadforge.models.registry import model_spec


def model_class(name: str) -> type[SequenceModel]:
    spec = model_spec(name, "proprio")
    if spec.trainer != "imitation":
        raise ValueError(f"model {name!r} is not an imitation sequence model (its trainer is {spec.trainer!r})")
    return spec.model_class()


def build_model(name: str, **config: Any) -> SequenceModel:
    cls = model_class(name)
    try:
        return cls(**config)
    except TypeError as err:   # an unknown/missing config key: one clear line naming the model
        raise ValueError(f"bad config for model {name!r}: {err}") from err


__all__ = ["Cache", "SequenceModel", "build_model", "model_class"]
