"""The one model registry: every model ``quadforge train`` builds, with what it can do.

A model is one ``ModelSpec`` per kind of input it reads. ``germ`` is two: over proprioceptive
transitions (``models.germ.GeRM``, trained by Q-learning) and over camera frames + an instruction
(``models.germ_vla.GeRMVLA``, the VLA trainer); ``rt1`` has only the vision one (it is vision-only);
the imitation zoo (``fcnet`` ...) only the proprioceptive one. Every list of models - the CLI's
``--model`` choices, the zoo a sweep tunes, the VLAs a benchmark times, which trainer and which policy
wrapper a checkpoint goes to - is derived from ``MODEL_SPECS``; nothing tests a name's spelling.

Capabilities (names, resolved by the layer that owns them, so this module never points up):

- ``reads``: the data it trains on - ``windows`` (proprioceptive layout windows,
  ``data.samplers.WindowSampler``), ``transitions`` (windows + next window + reward,
  ``data.samplers.TransitionSampler``), ``image_windows`` (camera frames + instruction,
  ``data.image_sampler``);
- ``trainer``: ``imitation`` | ``qlearning`` | ``vla`` (``training/cli.py`` ``TRAINER_MODULES``);
- ``policy``: the wrapper that deploys its checkpoint - ``learned`` | ``germ`` | ``vla``
  (``experts/registry.py``);
- ``objective``: ``imitation`` (regress or classify the demonstrated actions) | ``q`` (conservative
  Q-learning); ``dense``: built with dense FFNs at the MoE's active size (GeRM w/o MoE).

Adding a model: its file under ``models/`` and one ``register_model(ModelSpec(...))`` line below (an
imitation model's training presets with it: ``presets=``, the zoo's in ``models/zoo_presets.py``; without them
``training.presets.GENERIC_PRESETS``). A model registered elsewhere (before the command runs) is as
much a model: ``train``, the sweep's zoo and the benchmarks read this registry when asked.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from quadforge.models.zoo_presets import ZOO_PRESETS

INPUTS = ("proprio", "vision")
READS = ("windows", "transitions", "image_windows")
TRAINERS = ("imitation", "qlearning", "vla")
POLICIES = ("learned", "germ", "vla")
OBJECTIVES = ("imitation", "q")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    inputs: str                  # "proprio" | "vision"
    cls: str                     # "module:Class", imported on use
    reads: str
    trainer: str
    policy: str
    objective: str = "imitation"
    dense: bool = False
    help: str = ""
    # imitation models: preset name -> training.presets.TrainConfig fields (plain data, e.g. {"cpu": {"context":
    # 8, ..., "optim": {...}}}); None: the trainer's documented generic cpu/paper presets (training.presets)
    presets: Mapping[str, Mapping[str, Any]] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        for field_name, allowed in (("inputs", INPUTS), ("reads", READS), ("trainer", TRAINERS),
                                    ("policy", POLICIES), ("objective", OBJECTIVES)):
            if getattr(self, field_name) not in allowed:
                raise ValueError(f"model {self.name!r}: {field_name}={getattr(self, field_name)!r}; "
                                 f"allowed: {allowed}")
        module, colon, cls = str(self.cls).partition(":")
        if not (module and colon and cls) or ":" in cls:
            raise ValueError(f"model {self.name!r}: cls={self.cls!r}; give 'module:Class', e.g. "
                             f"'quadforge.models.mlp:HistoryMLP'")
        if self.presets is not None:
            if self.trainer != "imitation":
                raise ValueError(f"model {self.name!r}: presets= are the imitation trainer's; the {self.trainer} "
                                 f"trainer keeps its own")
            bad = [k for k, v in dict(self.presets).items() if not isinstance(v, Mapping) or "optim" not in v]
            if bad or not self.presets:
                raise ValueError(f"model {self.name!r}: presets {bad or '{}'}: give each preset name a dict of "
                                 f"TrainConfig fields with its optim dict")

    def model_class(self) -> type:
        module, cls = self.cls.split(":")
        return getattr(importlib.import_module(module), cls)


MODEL_SPECS: dict[tuple[str, str], ModelSpec] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    key = (spec.name, spec.inputs)
    if key in MODEL_SPECS:
        raise ValueError(f"model {spec.name!r} over {spec.inputs} inputs is already registered")
    MODEL_SPECS[key] = spec
    return spec


def model_names(**capabilities: Any) -> tuple[str, ...]:
    """Names of the models with every given capability (e.g. ``trainer="imitation"``,
    ``inputs="vision"``), in registration order, each once."""
    names: list[str] = []
    for spec in MODEL_SPECS.values():
        if all(getattr(spec, k) == v for k, v in capabilities.items()) and spec.name not in names:
            names.append(spec.name)
    return tuple(names)


def model_inputs(name: str) -> tuple[str, ...]:
    """The kinds of input ``name`` has a model for; an unknown name is a one-line error."""
    found = tuple(i for (n, i) in MODEL_SPECS if n == name)
    if not found:
        raise ValueError(f"model {name!r} unknown; allowed: {', '.join(model_names())}")
    return found


def vision_only(name: str) -> bool:
    return model_inputs(name) == ("vision",)


def model_spec(name: str, inputs: str | None = None) -> ModelSpec:
    """The spec of ``name`` over ``inputs`` (None: its only kind of input)."""
    have = model_inputs(name)
    if inputs is None:
        if len(have) > 1:
            raise ValueError(f"model {name!r} reads {' or '.join(have)} inputs; say which")
        inputs = have[0]
    if inputs not in have:
        raise ValueError(f"model {name!r} has no {inputs} variant (it reads {' or '.join(have)} inputs)")
    return MODEL_SPECS[(name, inputs)]


# --- the models ------------------------------------------------------------------------------------
_ZOO = "imitation sequence model (masked MSE / Gaussian NLL on joint actions)"
for _name, _cls in (("fcnet", "fcnet:FCNet"), ("transformer", "transformer:Transformer"),
                    ("convformer", "convformer:DecisionConvFormer"), ("starformer", "starformer:StARformer"),
                    ("mlp", "mlp:HistoryMLP")):
    register_model(ModelSpec(_name, "proprio", f"quadforge.models.{_cls}", reads="windows", trainer="imitation",
                             policy="learned", help=_ZOO, presets=ZOO_PRESETS[_name]))

_GERM = {"germ": ("q", False, "GeRM: MoE decoder, conservative discretised Q-learning"),
         "germ-il": ("imitation", False, "GeRM w/o RL: the MoE network by cross-entropy on the demonstrations"),
         "germ-dense": ("q", True, "GeRM w/o MoE: dense FFNs at the MoE's active parameter count")}
for _name, (_objective, _dense, _help) in _GERM.items():
    register_model(ModelSpec(_name, "proprio", "quadforge.models.germ:GeRM", reads="transitions",
                             trainer="qlearning", policy="germ", objective=_objective, dense=_dense, help=_help))
register_model(ModelSpec("rt1", "vision", "quadforge.models.rt1:RT1", reads="image_windows", trainer="vla",
                         policy="vla", objective="imitation",
                         help="RT-1-style VLA: dense decoder, non-autoregressive read-outs, CE on bins"))
for _name, (_objective, _dense, _help) in _GERM.items():
    register_model(ModelSpec(_name, "vision", "quadforge.models.germ_vla:GeRMVLA", reads="image_windows",
                             trainer="vla", policy="vla", objective=_objective, dense=_dense,
                             help=_help + " (over camera frames + instruction)"))


def build_vla_model(name: str, cfg: Any) -> Any:
    """The vision-language model ``name`` from its ``models.vla.VLAConfig`` (the trainer and the
    deployed policy build it here; ``cfg`` is already dense for a ``dense`` model)."""
    return model_spec(name, "vision").model_class()(cfg)
