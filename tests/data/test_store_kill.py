"""A compaction killed with SIGKILL at an arbitrary moment leaves a store that opens, validates and
completes at the next compaction without duplicates (whatever moment the kill lands on)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from quadforge.data.writer import StagingWriter
from quadforge.data.compaction import compact
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_info
from quadforge.data.validate import validate

ROOT = Path(__file__).resolve().parents[2]


def _stage(store, collector, n, seed):
    rng = np.random.default_rng(seed)
    w = StagingWriter(store, collector)
    return [w.write_episode(synthetic_episode(rng, 400, True), synthetic_info(i, True)) for i in range(n)]


SCRIPT = ("import sys, zarr; from quadforge.data.compaction import compact; print('ready', flush=True); "
          "sys.stdin.readline(); compact(sys.argv[1]); print('done', flush=True)")


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_sigkill_during_compaction(tmp_path, delay):
    store = tmp_path / "s"
    ids = _stage(store, "c0", 3, seed=0)
    compact(store)
    ids += _stage(store, "c1", 40, seed=1)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(store)], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "ready"   # imports done: the kill lands in compaction
    proc.stdin.write("go\n")
    proc.stdin.flush()
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    s = TrajectoryStore.open(store)            # generation 1 or 2, never a broken one
    assert s.generation in (1, 2) and validate(store).ok, validate(store).text()
    compact(store)
    s = TrajectoryStore.open(store)
    assert s.episode_ids == ids                 # everything, once, in order
    assert validate(store).ok
