"""The one place seeds come from: named sub-streams and the data-parallel ranks' seeds."""
import pytest

from quadforge.seeding import derive_seed, rank_seed


def test_rank_zero_keeps_the_seed_and_other_ranks_never_meet_another_seeds_stream():
    assert rank_seed(7, 0) == 7                        # a one-process run is the same run
    seeds = {(s, r): rank_seed(s, r) for s in range(4) for r in range(4)}
    assert len(set(seeds.values())) == len(seeds)      # seed + rank would give (0, 1) and (1, 0) one stream
    assert rank_seed(7, 2) == derive_seed(7, "rank2")


def test_seeding_turns_on_deterministic_algorithms_without_the_nan_fill_of_new_tensors():
    import torch

    from quadforge.seeding import seed_everything
    seed_everything(0)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is False


def test_the_nan_fill_seeding_turns_off_changes_no_trained_bit():
    """The fill guards ops that leave new memory unwritten: training writes every element it reads, so
    weights trained with and without it are the same bits (FCNet and a Transformer, a few AdamW steps)."""
    import torch

    from quadforge.models import build_model
    from quadforge.seeding import seed_everything

    def trained(name: str, fill: bool) -> list:
        seed_everything(0)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        extra = {"modes": 4} if name == "fcnet" else {"num_heads": 2}
        model = build_model(name, obs_dim=9, action_dim=3, context=8, num_layers=2, hidden=16, **extra)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            obs, target = torch.randn(6, 8, 9, generator=g), torch.randn(6, 8, 3, generator=g)
            loss = (model(obs, mask=torch.ones(6, 8)) - target).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    try:
        for name in ("fcnet", "transformer"):
            with_fill, without = trained(name, True), trained(name, False)
            assert all(torch.equal(a, b) for a, b in zip(with_fill, without)), name
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = False


def test_a_seed_must_be_an_integer():
    import numpy as np

    from quadforge.seeding import derive_seed, seed_everything
    for bad in (1.5, True, "3", None):   # 1.5 ran seed 1's run, True seed 1's, silently
        with pytest.raises(ValueError, match="seed=.* is invalid; allowed: an integer"):
            seed_everything(bad)
        with pytest.raises(ValueError, match="allowed: an integer"):
            derive_seed(bad, "x")
    assert derive_seed(np.int64(3), "x") == derive_seed(3, "x")
