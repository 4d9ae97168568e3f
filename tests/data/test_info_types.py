"""Typed episode info: a value its table column would cast wrongly (bool("no") is True) is refused, naming
the key and the value, and nothing is staged or merged."""
import numpy as np
import pytest

from quadforge.data.compaction import compact
from quadforge.data.staging import list_quarantined, list_staged, write_episode_file
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_info
from quadforge.data.writer import StagingWriter


def _episode(i=0, success=True):
    return synthetic_episode(np.random.default_rng(i), 12, success), synthetic_info(i, success)


@pytest.mark.parametrize("key,value", [("success", "no"), ("success", "False"), ("success", "0"),
                                       ("success", 2), ("success", None), ("terminated", "yes"),
                                       ("terrain_level", 2.5), ("terrain_level", "3"), ("seed", True),
                                       ("return", "1.5"), ("cmd_vx", None), ("label", "good"),
                                       ("terrain_type", 3), ("gait", None), ("task", 1), ("policy_id", 7),
                                       ("failure_reason", 2), ("instruction", 4)])
def test_writer_refuses_a_mistyped_info_value_and_stages_nothing(tmp_path, key, value):
    feats, info = _episode()
    with StagingWriter(tmp_path, "me") as w:
        with pytest.raises(ValueError, match=rf"episode me-00000000: info '{key}'=.*must be"):
            w.write_episode(feats, {**info, key: value})
        assert list_staged(tmp_path) == []
        assert w.next_episode_id() == "me-00000000"   # the id was not used up


@pytest.mark.parametrize("value,stored", [(True, True), (False, False), (np.bool_(True), True), (0, False),
                                          (1, True), (np.int64(1), True)])
def test_writer_takes_real_flags(tmp_path, value, stored):
    feats, info = _episode()
    with StagingWriter(tmp_path, "me") as w:
        w.write_episode(feats, {**info, "success": value, "terrain_level": np.int64(3), "seed": 4.0})
    compact(tmp_path)
    table = TrajectoryStore.open(tmp_path).episodes
    assert bool(table["success"][0]) is stored and int(table["terrain_level"][0]) == 3


def test_compaction_quarantines_a_staging_file_with_a_mistyped_flag(tmp_path):
    """A staging file written by other code than the writer: quarantined with the reason, not merged as True."""
    feats, info = _episode()
    with StagingWriter(tmp_path, "me") as w:
        w.write_episode(feats, info)
    feats2, info2 = _episode(1)
    info2 = {**info2, "success": "no", "episode_id": "other-00000000", "collector_id": "other", "length": 12}
    write_episode_file(tmp_path / "staging" / "other-00000000.episode", feats2, info2)
    result = compact(tmp_path)
    assert len(result.quarantined) == 1
    (path, reason), = list_quarantined(tmp_path)
    assert path.name == "other-00000000.episode" and "info 'success'='no'" in reason
    assert TrajectoryStore.open(tmp_path).num_episodes == 1
