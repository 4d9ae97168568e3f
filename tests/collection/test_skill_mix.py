"""Skill mixes: parsing, sampling ranges, determinism, the env hook."""
import numpy as np
import pytest
import torch

from quadforge.collection.skills import DEFAULT_COMMAND, SKILLS, SkillCommandSampler, parse_skills, tasks_table
from quadforge.layout import COMMAND_NAMES

IDX = {n: i for i, n in enumerate(COMMAND_NAMES)}


def test_every_fcnet_skill_exists_and_defaults_cover_the_command_space():
    assert set(SKILLS) == {"standing", "walking", "running", "crawling", "squeezing", "tilting", "turning"}
    assert tuple(DEFAULT_COMMAND) == COMMAND_NAMES


def test_parse_weights_all_and_single():
    mix = parse_skills("walking=0.5, running=1.5")
    assert mix.weights == pytest.approx({"walking": 0.25, "running": 0.75})
    assert set(parse_skills("all").names) == set(SKILLS)
    assert parse_skills("turning").weights == {"turning": 1.0}
    assert parse_skills(mix.to_string()).weights == pytest.approx(mix.weights)


@pytest.mark.parametrize("bad,match", [("flying=1", "unknown skills"), ("walking=x", "not a number"),
                                       ("walking=-1", ">= 0"), ("", "empty mix"),
                                       ("walking=1,walking=2", "twice")])
def test_bad_mixes_are_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_skills(bad)


def test_each_skill_samples_inside_its_ranges():
    rng = np.random.default_rng(0)
    for skill in SKILLS.values():
        cmds = skill.sample(200, rng)
        assert cmds.shape == (200, 15) and cmds.dtype == np.float32
        for key, value in skill.command.items():
            col = cmds[:, IDX[key]]
            if key in skill.symmetric:
                col = np.abs(col)
            if isinstance(value, tuple):
                assert col.min() >= value[0] - 1e-6 and col.max() <= value[1] + 1e-6, (skill.name, key)
            else:
                assert np.allclose(col, value)
        untouched = [k for k in COMMAND_NAMES if k not in skill.command]
        for key in untouched:
            assert np.allclose(cmds[:, IDX[key]], DEFAULT_COMMAND[key])
    turning = SKILLS["turning"].sample(200, rng)[:, IDX["ang_vel_yaw"]]
    assert (turning > 0).any() and (turning < 0).any()  # both directions
    crawl = SKILLS["crawling"].sample(50, rng)[:, IDX["body_height"]]
    assert (crawl < 0).all()  # lowered body


def test_mix_follows_its_weights_and_is_seeded():
    mix = parse_skills("walking=0.8,standing=0.2")
    names, cmds = mix.sample(4000, np.random.default_rng(1))
    assert abs(names.count("walking") / 4000 - 0.8) < 0.03
    standing_rows = np.array([n == "standing" for n in names])
    assert np.allclose(cmds[standing_rows, :3], 0.0)
    again = mix.sample(4000, np.random.default_rng(1))
    assert again[0] == names and np.array_equal(again[1], cmds)


def test_sampler_hook_tracks_skill_per_env_and_is_deterministic():
    mix = parse_skills("all")
    a, b = SkillCommandSampler(mix, 6, seed=3), SkillCommandSampler(mix, 6, seed=3)
    ids = torch.tensor([1, 4])
    ca, cb = a(ids), b(ids)
    assert ca.shape == (2, 15) and torch.equal(ca, cb)
    assert a.current[0] == "" and a.current[1] in SKILLS and a.current[4] in SKILLS
    assert not torch.equal(SkillCommandSampler(mix, 6, seed=4)(ids), ca)


def test_tasks_table_describes_the_mix():
    table = tasks_table(parse_skills("walking=1,running=1"))
    assert set(table) == {"walking", "running"} and all(isinstance(v, str) and v for v in table.values())
    assert set(tasks_table()) == set(SKILLS)
