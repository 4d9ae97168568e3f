import numpy as np
import pytest

from quadforge.data.writer import StagingWriter
from quadforge.data.synthetic import synthetic_episode, synthetic_info


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few steps, so tiny stores still cross chunk boundaries."""
    import quadforge.data.compaction as c
    monkeypatch.setattr(c, "TARGET_CHUNK_BYTES", 256)


@pytest.fixture
def write_episodes():
    """write_episodes(store, collector, n, seed) -> list of (episode_id, features, info)."""
    def _write(store, collector="c0", n=3, seed=0, lengths=None):
        rng = np.random.default_rng(seed)
        w = StagingWriter(store, collector)
        out = []
        for i in range(n):
            length = int(lengths[i]) if lengths is not None else int(rng.integers(5, 40))
            success = i % 3 != 2
            feats = synthetic_episode(rng, length, success)
            info = synthetic_info(i, success)
            out.append((w.write_episode(feats, info), feats, info))
        return out
    return _write
