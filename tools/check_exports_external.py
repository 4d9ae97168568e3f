"""Read quadforge's exports back with the other projects' own loaders: LeRobot's ``LeRobotDataset`` and
robomimic's ``SequenceDataset`` - not with quadforge's code - and compare every step with the store.

LeRobot pins torch < 2.11 and quadforge's venv has torch 2.13, so the readers live in a separate,
throw-away venv (docs/data.md, "Checking the exports with LeRobot and robomimic"):

    python3 -m venv /tmp/readers-venv
    /tmp/readers-venv/bin/pip install "torch==2.10.*" lerobot==0.4.4 robomimic==0.3.0

Then, from quadforge's venv (exports the store both ways, writes the store's own values as a reference
.npz, and runs the ``check`` step with the readers' python):

    python tools/check_exports_external.py all --store S --work DIR --readers-python /tmp/readers-venv/bin/python

``check`` alone (in the readers' venv) compares the exports in DIR with DIR/reference.npz and prints one
JSON summary; exit 0 when every episode boundary, action, reward, done, task and camera frame is identical.
Nothing is downloaded: both readers are pointed at local files (``HF_HUB_OFFLINE=1``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


# --- quadforge's side: the exports and the reference -----------------------------------------------------
def write_reference(store_path: str, work: Path, action: str = "auto") -> dict:
    """Export ``store_path`` to work/lerobot and work/export.h5; work/reference.npz holds what the store says
    each step is (read with quadforge's reader): one row per step, cameras holding the latest frame."""
    from quadforge.data.export import export_hdf5, obs_key
    from quadforge.data.export_lerobot import action_feature, export_lerobot
    from quadforge.data.images import hold_frames
    from quadforge.data.store import TrajectoryStore
    store = TrajectoryStore.open(store_path)
    info = export_lerobot(store_path, work / "lerobot", action=action)
    export_hdf5(store_path, work / "export.h5")
    t = store.episodes
    act = action_feature(store, action)
    data = store.load([act, "actions", "rewards"])
    ref = {"starts": np.asarray(t["start"]), "ends": np.asarray(t["end"]), "success": np.asarray(t["success"]),
           "action": data[act], "joint_actions": data["actions"], "rewards": data["rewards"],
           "tasks": np.asarray([_task(store, i) for i in range(len(t))])}
    stride = store.schema.frame_stride or 1
    for cam in store.image_features:
        frames = np.asarray(store.array(cam)[:])
        starts, counts = store.frame_starts(cam), store.frame_counts(cam)
        ref["camera/" + obs_key(cam)] = np.concatenate(
            [hold_frames(frames[s:s + k], int(e - b), stride)
             for s, k, b, e in zip(starts, counts, t["start"], t["end"])])
    np.savez(work / "reference.npz", **ref)
    return info


def _task(store, i: int) -> str:
    from quadforge.data.export_lerobot import _task_of
    return _task_of(store, i)


# --- the readers' side: LeRobot and robomimic, nothing of quadforge ---------------------------------------
def check_lerobot(root: Path, ref) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    ds = LeRobotDataset("quadforge/export", root=root)
    eps = ds.meta.episodes
    bounds = [(int(e["dataset_from_index"]), int(e["dataset_to_index"])) for e in eps]
    cams = [k for k in ds.meta.camera_keys]
    actions, rewards, dones, tasks, frames = [], [], [], [], {k: [] for k in cams}
    for i in range(len(ds)):
        item = ds[i]
        actions.append(item["action"].numpy())
        rewards.append(float(item["next.reward"]))
        dones.append(bool(item["next.done"]))
        tasks.append(item["task"])
        for k in cams:   # LeRobot hands images as CHW floats in [0, 1]
            frames[k].append((item[k].numpy() * 255.0).round().astype(np.uint8).transpose(1, 2, 0))
    starts, ends = ref["starts"], ref["ends"]
    out = {"reader": "lerobot.datasets.lerobot_dataset.LeRobotDataset", "frames": len(ds),
           "episodes": ds.meta.total_episodes, "fps": ds.fps, "cameras": cams,
           "episode_boundaries_identical": bounds == list(zip(starts.tolist(), ends.tolist())),
           "actions_identical": bool(np.array_equal(np.stack(actions), ref["action"].reshape(len(ds), -1))),
           "rewards_identical": bool(np.array_equal(np.asarray(rewards, np.float32), ref["rewards"])),
           "dones_identical": [i for i, d in enumerate(dones) if d] == [e - 1 for e in ends.tolist()],
           "tasks_identical": tasks == [str(ref["tasks"][np.searchsorted(ends, i, side="right")])
                                        for i in range(len(ds))],
           "success_identical": [bool(e["success"]) for e in eps] == ref["success"].tolist(),
           "failure_reasons": sorted({str(e["failure_reason"]) for e in eps})}
    for k in cams:
        want = ref["camera/" + k.split(".")[-1]]
        out[f"frames_identical[{k}]"] = bool(np.array_equal(np.stack(frames[k]), want))
    return out


def check_robomimic(h5: Path, ref) -> dict:
    import h5py
    import robomimic.utils.obs_utils as ObsUtils
    from robomimic.utils.dataset import SequenceDataset
    with h5py.File(h5, "r") as f:
        keys = sorted(f["data/demo_0/obs"].keys())
        cams = sorted(json.loads(f["data"].attrs.get("cameras", "{}")))
    ObsUtils.initialize_obs_utils_with_obs_specs({"obs": {"low_dim": [k for k in keys if k not in cams],
                                                          "rgb": cams}})
    ds = SequenceDataset(str(h5), obs_keys=keys, dataset_keys=("actions", "rewards", "dones"), seq_length=1,
                         frame_stack=1, load_next_obs=True, hdf5_cache_mode=None)
    demos = ds.demos
    lengths = [int(ds._demo_id_to_demo_length[d]) for d in demos]
    actions, rewards, dones, frames = [], [], [], {k: [] for k in cams}
    for i in range(len(ds)):
        item = ds[i]
        actions.append(item["actions"][0])
        rewards.append(item["rewards"][0])
        dones.append(int(item["dones"][0]))
        for k in cams:
            frames[k].append(item["obs"][k][0])
    splits = {}
    for split in ("train", "valid"):
        splits[split] = SequenceDataset(str(h5), obs_keys=keys[:1], dataset_keys=("actions",), seq_length=1,
                                        filter_by_attribute=split, load_next_obs=False).demos
    ends = ref["ends"]
    out = {"reader": "robomimic.utils.dataset.SequenceDataset", "samples": len(ds), "demos": len(demos),
           "obs_keys": keys, "cameras": cams,
           "episode_boundaries_identical": lengths == (ends - ref["starts"]).tolist(),
           "actions_identical": bool(np.array_equal(np.stack(actions), ref["joint_actions"])),
           "rewards_identical": bool(np.array_equal(np.asarray(rewards, np.float32), ref["rewards"])),
           "dones_identical": [i for i, d in enumerate(dones) if d] == [e - 1 for e in ends.tolist()],
           "mask_train_valid_cover_every_demo": sorted(splits["train"] + splits["valid"],
                                                       key=lambda d: int(d[5:])) == demos,
           "mask_sizes": {k: len(v) for k, v in splits.items()}}
    for k in cams:
        out[f"frames_identical[{k}]"] = bool(np.array_equal(np.stack(frames[k]), ref["camera/" + k]))
    return out


def check(work: Path) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_CACHE", str(work / "hf_cache"))
    ref = np.load(work / "reference.npz")
    result = {"lerobot": check_lerobot(work / "lerobot", ref), "robomimic": check_robomimic(work / "export.h5", ref)}
    verdicts = [v for r in result.values() for k, v in r.items() if k.endswith("identical") or k.startswith("frames_")
                or k.startswith("mask_train")]
    result["all_identical"] = all(verdicts)
    print(json.dumps(result, indent=1))
    return 0 if result["all_identical"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("all", help="export, write the reference, run `check` in the readers' venv")
    a.add_argument("--store", required=True, help="the trajectory store to export")
    a.add_argument("--work", required=True, help="a new folder for the exports and the reference")
    a.add_argument("--readers-python", required=True, help="python of the venv with lerobot and robomimic")
    a.add_argument("--action", default="auto", help="export-lerobot --action (auto | command | joint)")
    c = sub.add_parser("check", help="(in the readers' venv) compare the exports in --work with its reference")
    c.add_argument("--work", required=True)
    args = p.parse_args(argv)
    work = Path(args.work)
    if args.step == "check":
        return check(work)
    work.mkdir(parents=True, exist_ok=True)
    write_reference(args.store, work, args.action)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf_home"), "PYTHONPATH": ""}
    return subprocess.run([args.readers_python, str(Path(__file__).resolve()), "check", "--work", str(work)],
                          env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
