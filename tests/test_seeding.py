"""The one place seeds come from: named sub-streams and the data-parallel ranks' seeds."""
from quadforge.seeding import derive_seed, rank_seed


def test_rank_zero_keeps_the_seed_and_other_ranks_never_meet_another_seeds_stream():
    assert rank_seed(7, 0) == 7                        # a one-process run is the same run
    seeds = {(s, r): rank_seed(s, r) for s in range(4) for r in range(4)}
    assert len(set(seeds.values())) == len(seeds)      # seed + rank would give (0, 1) and (1, 0) one stream
    assert rank_seed(7, 2) == derive_seed(7, "rank2")
