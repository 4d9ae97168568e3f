import pytest
import torch
from torch import nn

from quadforge.layout import get_layout
from quadforge.models.checkpoint import (Checkpoint, check_model, export_checkpoint, latest_checkpoint, load_checkpoint,
                                          load_state, save_checkpoint)

torch.set_num_threads(1)


def _ckpt(model, **kw):
    return Checkpoint(model_name="mlp", model_config={"hidden": 4}, state_dict=model.state_dict(),
                      layout=get_layout("proprio").to_dict(),
                      obs_stats={"mean": torch.zeros(3), "std": torch.ones(3)},
                      provenance={"store": "/x", "generation": 2, "episodes": 5}, step=7, seed=3, **kw)


def test_round_trip(tmp_path):
    model = nn.Linear(3, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward(); opt.step()
    path = save_checkpoint(tmp_path / "a" / "last.pt", _ckpt(model, optimizer=opt.state_dict()))
    ck = load_checkpoint(path)
    assert ck.model_name == "mlp" and ck.step == 7 and ck.seed == 3 and ck.provenance["generation"] == 2
    assert get_layout("proprio").from_dict(ck.layout) == get_layout("proprio")
    other = nn.Linear(3, 4)
    load_state(other, ck)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    opt2 = torch.optim.AdamW(other.parameters()); opt2.load_state_dict(ck.optimizer)
    assert load_checkpoint(tmp_path / "a").step == 7        # a directory resolves to last.pt
    assert not list((tmp_path / "a").glob("*.tmp"))


def test_export_keeps_the_policy_and_drops_training_state(tmp_path):
    model = nn.Linear(3, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward(); opt.step()
    extra = {"policy_kind": "vla", "rng": {"torch": torch.get_rng_state()}, "target_state_dict": model.state_dict()}
    src = save_checkpoint(tmp_path / "run" / "last.pt", _ckpt(model, optimizer=opt.state_dict(), extra=extra))
    out = export_checkpoint(src, tmp_path / "shipped.pt", command="quadforge train ...")
    ck = load_checkpoint(out)
    assert ck.optimizer is None and ck.scheduler is None and ck.extra == {"policy_kind": "vla"}
    assert ck.provenance["command"] == "quadforge train ..." and ck.provenance["generation"] == 2
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ck.state_dict.values()))
    assert out.stat().st_size < src.stat().st_size


def test_wrong_shape_or_model_is_clear(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", _ckpt(nn.Linear(3, 4)))
    ck = load_checkpoint(path)
    with pytest.raises(ValueError, match="does not fit model"):
        load_state(nn.Linear(3, 5), ck)
    with pytest.raises(ValueError, match="holds model 'mlp', not 'fcnet'"):
        check_model(ck, "fcnet")
    with pytest.raises(ValueError, match="config differs"):
        check_model(ck, "mlp", {"hidden": 8})


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError):
        latest_checkpoint(tmp_path)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"junk.pt: not a quadforge/rsl_rl checkpoint \(a text file\); accepted"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a quadforge policy checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


def test_latest_picks_highest_step(tmp_path):
    for s in (2, 10, 9):
        save_checkpoint(tmp_path / f"step_{s}.pt", _ckpt(nn.Linear(3, 4)))
    assert latest_checkpoint(tmp_path).name == "step_10.pt"
    (tmp_path / "step_final.pt").write_bytes((tmp_path / "step_2.pt").read_bytes())   # not a step_<n>.pt
    assert latest_checkpoint(tmp_path).name == "step_10.pt"


def test_a_flipped_byte_is_damage_and_a_missing_device_is_not(tmp_path):
    model = nn.Linear(3, 4)
    path = save_checkpoint(tmp_path / "last.pt", _ckpt(model))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="map_location .cuda.: this machine has no CUDA GPU"):
            load_checkpoint(path, map_location="cuda")
    data = bytearray(path.read_bytes())
    offset = data.index(model.weight.detach().numpy().tobytes()) + 5    # inside the weight's stored bytes
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"damaged checkpoint \(member .* fails its CRC-32 check"):
        load_checkpoint(path)
