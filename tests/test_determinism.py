"""The determinism promise (README, "Determinism"): the same seed on the same machine with the same
thread counts gives the same result - bit for bit, across separate processes. Across CPUs (another
vector width) float kernels round differently, so only the documented tolerances hold there; no test
here compares against numbers recorded on one CPU."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _cli(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "quadforge.tools.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow   # four CLI processes (~15 s quiet); in-process twins run by default in test_imitation.py
def test_same_seed_same_collection_and_training_in_separate_processes(tmp_path):
    from quadforge.data.store import TrajectoryStore
    from quadforge.models.checkpoint import load_checkpoint
    stores = []
    for k in range(2):   # two processes, same seed: the same episodes, byte for byte
        store = tmp_path / f"s{k}"
        _cli("collect", "--store", str(store), "--episodes", "4", "--num-envs", "2", "--max-episode-s", "0.4",
             "--seed", "3", "--no-progress", "--num-threads", "1")
        stores.append(TrajectoryStore.open(store))
    a, b = (s.load() for s in stores)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert stores[0].episode_ids == stores[1].episode_ids
    weights = []
    for k in range(2):   # and two trainings on it: the same weights, bit for bit
        out = tmp_path / f"run{k}"
        _cli("train", "--model", "mlp", "--store", str(stores[0].root), "--out", str(out), "--preset", "cpu",
             "--max-steps", "3", "--batch-size", "8", "--seed", "5", "model.hidden=8", "tensorboard=False")
        weights.append(load_checkpoint(out / "last.pt").state_dict)
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
