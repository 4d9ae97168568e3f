"""The imitation model zoo behind one interface (``training.models.base.SequenceModel``).

``build_model(name, **config)`` builds any of them; ``model.config`` rebuilds the same one.
"""
from __future__ import annotations

from typing import Any

from quadforge.training.models.base import Cache, SequenceModel

# name -> "module:Class", imported on use so one model's import cost never lands on another's user
MODELS: dict[str, str] = {
    "fcnet": "quadforge.training.models.fcnet:FCNet",
    "transformer": "quadforge.training.models.transformer:Transformer",
    "convformer": "quadforge.training.models.convformer:DecisionConvFormer",
    "starformer": "quadforge.training.models.starformer:StARformer",
    "mlp": "quadforge.training.models.mlp:HistoryMLP",
}


def model_class(name: str) -> type[SequenceModel]:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; allowed: {sorted(MODELS)}")
    import importlib
    module, cls = MODELS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_model(name: str, **config: Any) -> SequenceModel:
    cls = model_class(name)
    try:
        return cls(**config)
    except TypeError as err:   # an unknown/missing config key: one clear line naming the model
        raise ValueError(f"bad config for model {name!r}: {err}") from err


__all__ = ["MODELS", "Cache", "SequenceModel", "build_model", "model_class"]
