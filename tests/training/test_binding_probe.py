"""The binding probe's asked-both-ways first frames and its three checks (training.binding_probe)."""
import numpy as np
import pytest
import torch

from quadforge.training.binding_probe import acted, carried, first_frames, legible, main

CKPT = "experts/checkpoints/vla_rt1.pt"
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def asked():
    return first_frames("distinguish", 20, seed=3)


def test_every_frame_is_asked_for_both_candidates_with_the_side_flipped(asked):
    n = len(asked) // 2
    assert len(asked) == 40 and asked.images.shape == (40, 64, 64, 3)
    np.testing.assert_array_equal(asked.images[:n], asked.images[n:])
    np.testing.assert_array_equal(asked.left[:n], 1.0 - asked.left[n:])
    for named, other in zip(asked.instructions[:n], asked.instructions[n:]):
        assert named.startswith("distinguish letter ") and other.startswith("distinguish letter ")
        assert named.split()[2] != other.split()[2] and named.split(",")[1] == other.split(",")[1]
    assert 0 < asked.left.mean() < 1


def test_the_three_checks_score_shares_on_held_out_frames(asked, tmp_path):
    test = first_frames("distinguish", 8, seed=4)
    a = acted(CKPT, test)
    assert set(a) == {"toward_asked", "same_turn_both_ways"} and all(0 <= v <= 1 for v in a.values())
    c = carried(CKPT, asked, test, steps=5)
    assert set(c) == {"linear", "mlp"} and all(0 <= v <= 1 for v in c.values())
    rows = legible(CKPT, asked, test, steps=2, every=1)
    assert len(legible(CKPT, asked, test, steps=1, fresh=True)) == 1
    with pytest.raises(ValueError, match="not a (VLA|quadforge policy) checkpoint"):   # fresh or not
        legible("experts/checkpoints/go1_flat_forward_ppo.pt", asked, test, steps=1, fresh=True)
    assert [r["step"] for r in rows] == [1, 2] and all(0 <= r["held_out"] <= 1 for r in rows)
    with pytest.raises(SystemExit):
        main([CKPT, "--checks", "legible,seen"])


def test_bad_input_is_one_line_not_a_traceback(capsys):
    for argv, said in (([CKPT, "--family", "nope", "--checks", "acted"], "unknown QUARD family 'nope'"),
                       ([str(CKPT) + ".missing", "--checks", "acted"], "does not exist")):
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err
