"""Trainer configs refuse a count that is not a whole number (int() truncated 2.5, or numpy failed later)."""
import pytest

from quadforge.training.presets import preset
from quadforge.training.qlearning import default_config as germ_config
from quadforge.training.vla import default_config as vla_config


@pytest.mark.parametrize("make,prefix", [(lambda: preset("mlp", "cpu"), "train config "),
                                         (lambda: germ_config("germ"), ""),
                                         (lambda: vla_config("rt1"), "VLA train config ")])
@pytest.mark.parametrize("field,value,match", [("batch_size", 2.5, "must be a whole number, got float"),
                                               ("batch_size", True, "must be a whole number, got bool"),
                                               ("max_steps", 10.5, "must be a whole number"),
                                               ("batch_size", 0, "must be >= 1")])
def test_trainer_configs_refuse_non_whole_counts(make, prefix, field, value, match):
    cfg = make()
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=f"^{prefix}{field}={value!r}: {match}"):
        cfg.validate()
    setattr(cfg, field, 4)
    cfg.validate()
