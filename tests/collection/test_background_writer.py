"""The background staging writer: order, durability on flush/close, errors surface in the caller."""
import numpy as np
import pytest

from quadforge.collection.background_writer import BackgroundWriter


class ListWriter:
    def __init__(self, fail_at=None):
        self.ids, self.fail_at = [], fail_at

    def write_episode(self, features, info):
        if len(self.ids) == self.fail_at:
            raise OSError("disk full")
        self.ids.append(f"c-{len(self.ids):08d}:{info['n']}")
        return self.ids[-1]


def test_writes_in_submission_order_and_flush_waits():
    inner = ListWriter()
    with BackgroundWriter(inner, max_pending=2) as bg:
        for n in range(20):
            bg.submit({"x": np.zeros(3)}, {"n": n})
        bg.flush()
        assert bg.written == 20
    assert [i.split(":")[1] for i in inner.ids] == [str(n) for n in range(20)]
    assert bg.last_episode_id == inner.ids[-1]


def test_a_write_error_reaches_the_caller_and_never_hangs():
    bg = BackgroundWriter(ListWriter(fail_at=3), max_pending=1)
    with pytest.raises(RuntimeError, match="disk full"):
        for n in range(50):          # a full queue behind a dead writer must not block forever
            bg.submit({}, {"n": n})
        bg.flush()
    with pytest.raises(RuntimeError, match="disk full"):
        bg.close()
    with pytest.raises(ValueError, match="max_pending"):
        BackgroundWriter(ListWriter(), max_pending=0)


def test_staging_files_are_complete_after_close(tmp_path):
    from quadforge.data import staging
    from quadforge.data.writer import StagingWriter
    from collection_fakes import EchoPolicy, ScriptedEnv
    from quadforge.collection.rollout import Rollout

    writer = StagingWriter(tmp_path, "t")
    with BackgroundWriter(writer) as bg:
        for ep in Rollout(ScriptedEnv(), EchoPolicy()).episodes(max_episodes=5):
            bg.submit(ep.features, ep.info)
    files = staging.list_staged(tmp_path)
    assert [staging.episode_id_of(p) for p in files] == [f"t-{i:08d}" for i in range(5)]
    features, info = staging.read_staged(files[0])
    assert set(features) >= {"actions", "dof_pos", "commands", "rewards"} and info["episode_id"] == "t-00000000"
