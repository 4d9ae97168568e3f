"""The exports read back by the other projects' own loaders - LeRobot's LeRobotDataset and robomimic's
SequenceDataset - in a separate venv (LeRobot pins torch < 2.11; quadforge's venv has 2.13):
tools/check_exports_external.py, docs/data.md "Checking the exports with LeRobot and robomimic"."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READERS = Path(os.environ.get("QUADFORGE_READERS_PYTHON", "/tmp/readers-venv/bin/python"))


@pytest.mark.slow
def test_lerobot_and_robomimic_read_the_exports_back_identically(tmp_path):
    pytest.importorskip("pyarrow")
    if not READERS.is_file():
        pytest.skip(f"no readers venv at {READERS} (python3 -m venv /tmp/readers-venv && /tmp/readers-venv/bin/pip "
                    f"install 'torch==2.10.*' lerobot==0.4.4 robomimic==0.3.0; or set QUADFORGE_READERS_PYTHON)")
    from quadforge.data.store import TrajectoryStore
    from quadforge.data.synthetic import write_synthetic_image_store
    store = TrajectoryStore.open(write_synthetic_image_store(tmp_path / "s", episodes=6))
    r = subprocess.run([sys.executable, str(ROOT / "tools/check_exports_external.py"), "all", "--store", str(store.root),
                        "--work", str(tmp_path / "w"), "--readers-python", str(READERS)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout[r.stdout.index("{"):])
    assert result["all_identical"]
    assert result["lerobot"]["frames"] == store.num_steps and result["lerobot"]["episodes"] == 6
    assert result["robomimic"]["samples"] == store.num_steps and result["robomimic"]["demos"] == 6
    assert result["lerobot"]["frames_identical[observation.images.front_rgb]"]
    assert result["robomimic"]["frames_identical[front_rgb]"]
