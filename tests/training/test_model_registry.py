"""The one model registry (models/registry.py): every list of models, trainer and policy wrapper comes
from it, and each capability it names resolves in the layer that owns it."""
import importlib

import pytest
import torch

from quadforge.experts.registry import MODEL_POLICIES, POLICY_KIND_MODULES
from quadforge.models.germ import GeRM, GeRMConfig
from quadforge.models.registry import (MODEL_SPECS, ModelSpec, model_names, model_spec, vision_only)
from quadforge.training import qlearning, vla
from quadforge.training.cli import TRAINER_MODULES


def test_every_capability_resolves():
    for spec in MODEL_SPECS.values():
        assert callable(importlib.import_module(TRAINER_MODULES[spec.trainer]).run_from_args), spec
        assert spec.policy in MODEL_POLICIES or spec.policy in POLICY_KIND_MODULES, spec
        assert isinstance(spec.model_class(), type), spec


def test_lists_are_derived_and_presets_cover_them():
    assert set(vla.vla_models()) == {"rt1", "germ", "germ-il", "germ-dense"} == set(vla.PRESETS["cpu"])
    assert set(qlearning.germ_models()) == {"germ", "germ-il", "germ-dense"}
    assert vision_only("rt1") and not vision_only("germ") and not vision_only("fcnet")
    assert model_spec("germ-dense", "vision").dense and model_spec("germ-il", "proprio").objective == "imitation"
    assert vla.default_config("germ-il").objective == "ce" and qlearning.default_config("germ-il").objective == "il"


def test_bad_names_and_capabilities_are_one_line_errors():
    with pytest.raises(ValueError, match="model 'rnn' unknown; allowed: fcnet"):
        model_spec("rnn")
    with pytest.raises(ValueError, match="'rt1' has no proprio variant"):
        model_spec("rt1", "proprio")
    with pytest.raises(ValueError, match="say which"):
        model_spec("germ")
    with pytest.raises(ValueError, match="trainer='ppo'"):
        ModelSpec("x", "proprio", "m:C", reads="windows", trainer="ppo", policy="learned")
    assert model_names(inputs="vision", objective="q") == ("germ", "germ-dense")


def test_a_model_class_not_module_colon_class_is_refused_at_registration():
    """ModelSpec(..., 'nomodule', ...) registered and failed on first use with 'not enough values to unpack'."""
    for cls in ("nomodule", ":C", "m:", "a:b:C"):
        with pytest.raises(ValueError, match=f"model 'x': cls={cls!r}; give 'module:Class'"):
            ModelSpec("x", "proprio", cls, reads="windows", trainer="imitation", policy="learned")


def test_germ_loads_weights_saved_before_the_decoder_was_shared():
    cfg = GeRMConfig(obs_dim=5, context=3, d_model=16, num_layers=1, num_heads=2, ffn_hidden=16, num_bins=4,
                     action_dim=3)
    torch.manual_seed(0)
    model = GeRM(cfg)
    old = {}
    for k, v in model.state_dict().items():   # the names GeRM's parts had before models/decoder.py
        k = k.replace("decoder.blocks.", "blocks.").replace("decoder.ln_f.", "ln_f.")
        old[k.replace("heads.weight", "head_w").replace("heads.bias", "head_b")] = v.clone() + 1.0
    fresh = GeRM(cfg)
    fresh.load_state_dict(old)
    assert torch.equal(fresh.heads.weight, model.heads.weight + 1.0)
    assert torch.equal(fresh.decoder.ln_f.bias, model.decoder.ln_f.bias + 1.0)
    with pytest.raises(ValueError, match="presets= are the imitation trainer's; the qlearning trainer keeps its own"):
        ModelSpec("x", "proprio", "m:C", reads="transitions", trainer="qlearning", policy="germ",
                  presets={"cpu": {"optim": {}}})
    with pytest.raises(ValueError, match="presets \\['cpu'\\]: give each preset name a dict of TrainConfig fields"):
        ModelSpec("x", "proprio", "m:C", reads="windows", trainer="imitation", policy="learned",
                  presets={"cpu": {"context": 8}})
