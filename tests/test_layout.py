import pytest
import torch

from quadforge.layout import LAYOUTS, TERM_DIMS, JOINT_NAMES, ObsLayout, get_layout


def _terms(batch=5):
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(batch, dim, generator=g) for name, dim in TERM_DIMS.items()}


def test_named_layout_widths():
    assert len(JOINT_NAMES) == 12 and JOINT_NAMES[0] == "FR_hip" and JOINT_NAMES[-1] == "RL_calf"
    assert LAYOUTS["legged_gym_48"].dim == 48
    assert LAYOUTS["legged_gym_235"].dim == 235
    assert LAYOUTS["wtw_70"].dim == 70
    assert LAYOUTS["legged_gym_235"].privileged and not LAYOUTS["fcnet"].privileged


def test_build_applies_scale_slice_and_clip():
    terms = _terms()
    out = get_layout("legged_gym_48").build(terms)
    assert out.shape == (5, 48)
    torch.testing.assert_close(out[:, :3], terms["base_lin_vel"] * 2.0)
    torch.testing.assert_close(out[:, 9:12], terms["commands"][:, :3] * torch.tensor([2.0, 2.0, 0.25]))
    scan = get_layout("legged_gym_235").build(terms)[:, 48:]
    torch.testing.assert_close(scan, ((terms["height_scan"] - 0.5) * 5.0).clamp(-5, 5))


def test_roundtrip_dict_and_errors():
    for layout in LAYOUTS.values():
        assert ObsLayout.from_dict(layout.to_dict()) == layout
    with pytest.raises(ValueError, match="unknown observation layout"):
        get_layout("nope")
    with pytest.raises(KeyError, match="needs observation terms"):
        get_layout("fcnet").build({"projected_gravity": torch.zeros(1, 3)})
