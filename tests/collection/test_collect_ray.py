"""`--workers 2`: two local Ray actors, each its own collector id, all through staging."""
import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("quadforge.data.compaction")
pytest.importorskip("quadforge.experts.gait")

from quadforge.collection.distributed import quotas  # noqa: E402
from quadforge.data.store import TrajectoryStore  # noqa: E402
from quadforge.data.validate import validate  # noqa: E402
from quadforge.tools.cli import main  # noqa: E402


def test_quotas_split_evenly():
    assert quotas(7, 3) == [3, 2, 2] and sum(quotas(1, 4)) == 1 and quotas(0, 2) == [0, 0]


@pytest.mark.slow
def test_two_ray_workers_reach_the_target_and_a_rerun_tops_up(tmp_path, capsys):
    out = tmp_path / "store"
    argv = ["collect", "--store", str(out), "--num-envs", "2", "--max-episode-s", "0.3", "--workers", "2",
            "--compact-every", "2", "--no-progress"]
    assert main(argv + ["--episodes", "6"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["collected"] == 6 and summary["in_store"] == 6
    assert {r["collector_id"] for r in summary["runs"]} == {"main.w0", "main.w1"}
    assert [r["episodes"] for r in summary["runs"]] == [3, 3]
    assert validate(out).ok
    table = TrajectoryStore.open(out).episodes
    assert set(table["collector_id"]) == {"main.w0", "main.w1"}
    assert len(set(table["episode_id"])) == 6
    assert len(set(table["seed"])) == 2                    # each worker its own seed

    assert main(argv + ["--episodes", "7"]) == 0           # top up by one, ids continue per collector
    table = TrajectoryStore.open(out).episodes
    ids = set(table["episode_id"])
    assert len(ids) == 7 and "main.w0-00000003" in ids


def test_a_dead_worker_is_one_line_naming_it_and_saying_the_staged_episodes_are_safe():
    import ray.exceptions

    from quadforge.collection.distributed import worker_died, worker_error
    from quadforge.errors import JobFailed
    err = worker_died(["main.w1"], "/data/s", ray.exceptions.ActorDiedError())
    msg = str(err)
    assert isinstance(err, JobFailed) and len(msg.splitlines()) == 1
    assert msg.startswith("Ray worker main.w1 died (The actor died unexpectedly")
    assert "staged so far is safe in /data/s" in msg and "rerun the same command to resume" in msg

    class Remote(ray.exceptions.RayTaskError):   # what ray.get raises for a worker's own exception
        def __init__(self, cause):
            self.cause = cause
    full = JobFailed("/data/s: staging episode main.w0-00000004 failed: No space left on device (ENOSPC); ...")
    assert str(worker_error(Remote(full), ["main.w0"], "/data/s")) == f"Ray worker main.w0: {full}"
    bad = worker_error(Remote(ValueError("policy checkpoint x.pt: wrong robot")), ["main.w0"], "/data/s")
    assert isinstance(bad, ValueError) and str(bad) == "Ray worker main.w0: policy checkpoint x.pt: wrong robot"


def _descendants(pid):
    """Every process below ``pid`` (this test's own collection: Ray's raylet and its workers)."""
    import os
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_a_killed_ray_worker_stops_the_job_with_one_line_and_a_rerun_keeps_every_staged_episode(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path
    out = tmp_path / "store"
    argv = [sys.executable, "-m", "quadforge.tools.cli", "collect", "--store", str(out), "--num-envs", "2",
            "--max-episode-s", "0.3", "--workers", "2", "--no-progress", "--episodes", "400"]
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 240
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and len(TrajectoryStore.existing_episode_ids(out)) >= 4:
            workers = [p for p in _descendants(proc.pid) if "CollectorWorker" in _cmdline(p)]
            victim = workers[0] if workers else None
        time.sleep(0.1)
    assert victim is not None, "the collection never got going"
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err
    ours = [line for line in err.splitlines() if line.startswith("quadforge collect:")]
    assert len(ours) == 1 and "Traceback" not in err, err
    print(ours[0])
    assert "Ray worker main.w" in ours[0] and "died" in ours[0] and "staged so far is safe" in ours[0]
    kept = len(TrajectoryStore.existing_episode_ids(out))
    assert kept >= 4
    assert main(["collect", "--store", str(out), "--num-envs", "2", "--max-episode-s", "0.3", "--no-progress",
                 "--episodes", str(kept)]) == 0   # everything staged is there: nothing to collect
    assert TrajectoryStore.open(out).num_episodes == kept and validate(out).ok
