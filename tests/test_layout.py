import pytest
import torch

from quadforge.layout import LAYOUTS, TERM_DIMS, JOINT_NAMES, LayoutTerm, ObsLayout, as_layout, get_layout


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


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="dof_pos", scale=(1.0, 2.0)), r"'dof_pos': scale=\(1.0, 2.0\); give one number or 12 numbers"),
    (dict(name="commands", scale=(2.0, 2.0), index=(0, 1, 2)), r"'commands': scale=.*give one number or 3"),
    (dict(name="dof_pos", index=(0, 20)), r"'dof_pos': index=\(0, 20\); entries must be whole numbers in 0..11"),
    (dict(name="dof_pos", index=(1.5,)), r"'dof_pos': index=\(1.5,\)"),
    (dict(name="dof_pos", index=()), r"'dof_pos': index=\(\)"),
    (dict(name="dof_pos", scale="2"), r"'dof_pos': scale='2'"),
    (dict(name="dof_posx"), r"unknown observation term 'dof_posx'"),
])
def test_layout_term_is_checked_when_built(kwargs, match):
    """A term whose scale or index disagrees with the term's width fails where it is made, naming the term
    (it used to report dim 12 and fail in build() with a size mismatch or torch's index error)."""
    with pytest.raises(ValueError, match=match):
        LayoutTerm(**kwargs)


def test_as_layout_takes_a_name_or_a_layout():
    assert as_layout("proprio") is get_layout("proprio")
    assert as_layout(get_layout("fcnet")) is get_layout("fcnet")
    with pytest.raises(ValueError, match="unknown observation layout 'proprioo'"):
        as_layout("proprioo")
    with pytest.raises(ValueError, match="WindowSampler: layout must be an ObsLayout or a layout name .*got int"):
        as_layout(3, "WindowSampler")
