"""`collect --task quard:...` with the privileged expert: image-bearing, instruction-labelled episodes."""
import json

import pytest

from quadforge.tools.cli import main

pytest.importorskip("quadforge.envs.quard.env")


def test_collect_quard_with_the_expert_writes_frames_instructions_and_task_params(tmp_path, capsys):
    store = tmp_path / "quard"
    assert main(["collect", "--task", "quard:go_to", "--policy", "quard_expert", "--episodes", "2",
                 "--num-envs", "2", "--store", str(store), "--no-progress", "--seed", "3"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["in_store"] == 2

    from quadforge.data.store import TrajectoryStore
    s = TrajectoryStore.open(store)
    assert s.num_episodes == 2
    for i in range(2):
        params = s.task_params(i)
        assert params["family"] == "go_to" and params["instruction"].startswith("go to the ")
    frames = s.array("images/front_rgb")
    assert frames.dtype.name == "uint8" and tuple(frames.shape[1:]) == (64, 64, 3)
    # one frame every 10 control steps (5 Hz at 50 Hz), frame j = step 10 j
    assert s.frame_stride("images/front_rgb") == 10
    assert int(s.frame_counts("images/front_rgb").sum()) == frames.shape[0]
    assert frames[:].max() > 0   # rendered, not blank


def test_collect_quard_without_images_keeps_everything_but_the_frames(tmp_path, capsys):
    """Also: no --policy on a QUARD task collects with the privileged expert (issue 27), as eval does."""
    store = tmp_path / "quard_no_images"
    assert main(["collect", "--task", "quard:stop", "--episodes", "1",
                 "--num-envs", "1", "--store", str(store), "--no-progress", "--seed", "3", "--no-images"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["in_store"] == 1

    from quadforge.data.store import TrajectoryStore
    from quadforge.data.validate import validate
    assert validate(store).ok
    s = TrajectoryStore.open(store)
    assert s.image_features == () and not any(n.startswith("images/") for n in s.feature_names)
    assert {"instruction", "task_target_pos", "hl_commands", "dof_pos"} <= set(s.feature_names)
    assert s.task_params(0)["family"] == "stop" and s.instruction_text(0).startswith("stop the ")
    assert "quard_expert" in str(s.episodes["policy_id"][0]) and bool(s.episodes["success"][0])


def test_collect_refuses_a_policy_that_cannot_know_the_quard_task(tmp_path, capsys):
    """A locomotion policy reads neither the instruction nor the target: its episodes could never succeed
    (issue 27: 4 timeouts, exit 0, no warning); collect says so and what to use, and writes no episode."""
    store = tmp_path / "s"
    assert main(["collect", "--task", "quard:go_to", "--policy", "gait", "--episodes", "2", "--num-envs", "1",
                 "--store", str(store), "--no-progress", "--no-images"]) != 0
    err = capsys.readouterr().err
    assert "collect --policy gait on --task quard:go_to: policy gait:trot reads none of" in err
    assert "can never succeed there; collect with --policy quard_expert (the default)" in err
    from quadforge.collection.collect import store_count
    assert store_count(str(store)) == 0


def test_no_images_is_refused_for_the_locomotion_task(tmp_path, capsys):
    assert main(["collect", "--episodes", "1", "--store", str(tmp_path / "s"), "--no-images"]) != 0
    assert "--no-images applies to camera tasks" in capsys.readouterr().err
