import json

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


@pytest.fixture
def as_format_1():
    """as_format_1(store): rewrite a compacted store as the code before table segments wrote it (the whole
    episode table in meta/episodes.json, its values' digest under the manifest's meta.episodes)."""
    from quadforge.data.episode_table import LEGACY_FILE, SEGMENTS_KEY, read_table
    from quadforge.data.integrity import manifest_digest, table_digest

    def _rewrite(store):
        m = json.loads((store / "manifest.json").read_text())
        table = read_table(store, m)
        (store / LEGACY_FILE).write_text(json.dumps({"columns": table.to_lists()}))
        for seg in m.pop(SEGMENTS_KEY, []):
            if seg["file"] != LEGACY_FILE:
                (store / seg["file"]).unlink()
        m["format_version"] = 1
        m["meta"]["episodes"] = table_digest(table.to_lists())
        m["digest"] = manifest_digest(m)
        (store / "manifest.json").write_text(json.dumps(m))
    return _rewrite
