"""`collect --task quard:... --counterfactual R`: the same scene recorded for both candidate targets."""
import json

import numpy as np
import pytest

from quadforge.tools.cli import main

pytest.importorskip("quadforge.envs.quard.env")


def test_paired_collection_records_identical_first_frames_with_different_instructions_and_actions(tmp_path, capsys):
    from quadforge.collection.counterfactual import pairs_of
    from quadforge.data.store import TrajectoryStore

    out = tmp_path / "paired"
    assert main(["collect", "--task", "quard:go_to", "--policy", "quard_expert", "--episodes", "4",
                 "--num-envs", "2", "--store", str(out), "--no-progress", "--seed", "5",
                 "--counterfactual", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["in_store"] == 4 and summary["run"]["pairs"] == 2

    s = TrajectoryStore.open(out)
    params = [s.task_params(i) for i in range(s.num_episodes)]
    pairs = pairs_of(params)
    assert len(pairs) == 2
    frames = s.array("images/front_rgb")
    starts = s.frame_starts("images/front_rgb")
    commands = s.load(["hl_commands"])["hl_commands"]
    step0 = np.concatenate([[0], s.episode_ends[:-1]])
    success = s.episodes["success"]
    for a, b in pairs:
        pa, pb = params[a], params[b]
        # the same scene: placements, colours, slots
        assert pb["original_instruction"] == pa["instruction"] and pb["instruction"] != pa["instruction"]
        assert pb["target"] == pa["distractor"] and pb["distractor"] == pa["target"]
        assert pb["target_slot"] == pa["distractor_slot"]
        assert s.instruction_text(a) == pa["instruction"] and s.instruction_text(b) == pb["instruction"]
        # identical first frames
        np.testing.assert_array_equal(frames[int(starts[a])], frames[int(starts[b])])
        # the expert walks to the other object: its first commands turn the other way (slots at y = +-0.75)
        wz = commands[:, 2]
        assert np.sign(wz[step0[a]]) == -np.sign(wz[step0[b]]) != 0
        assert success[a] and success[b]


def test_counterfactual_share_is_checked(tmp_path, capsys):
    assert main(["collect", "--task", "quard:go_to", "--policy", "quard_expert", "--episodes", "1",
                 "--store", str(tmp_path / "s"), "--counterfactual", "1.5"]) != 0
    assert "--counterfactual=1.5 is invalid" in capsys.readouterr().err
    assert main(["collect", "--episodes", "1", "--store", str(tmp_path / "t"), "--counterfactual", "0.5"]) != 0
    assert "--counterfactual applies to the QUARD tasks" in capsys.readouterr().err


def test_wants_partner_is_seeded_per_scene_and_follows_the_share():
    from quadforge.collection.counterfactual import wants_partner
    draws = [wants_partner(7, i, k, 0.3) for i in range(20) for k in range(20)]
    assert draws == [wants_partner(7, i, k, 0.3) for i in range(20) for k in range(20)]
    assert 0.2 < np.mean(draws) < 0.4
    assert all(wants_partner(7, 0, k, 1.0) for k in range(5)) and not any(wants_partner(7, 0, k, 0.0) for k in range(5))
