"""A QUARD task family is one registration: a toy family registered here appears in the instructions, the
env builder, the rules, the privileged expert, ``collect``, ``eval`` and the Table III report, none of
which is touched."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from quadforge.envs.quard import families
from quadforge.envs.quard.family.base import Draw, EpisodeScene, Family, Placement
from quadforge.envs.quard.words import COLOURS


def _sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    """Two still balls of different colours in the two slots; the named one is the target."""
    colour = d.pick(d.colours)
    other = d.pick(d.colours, exclude=(colour,))
    placements = [Placement(("ball", "", 0), d.target, 0.0, colour), Placement(("ball", "", 1), d.distractor, 0.0, other)]
    d.params.update(target={"ball": colour}, distractor={"ball": other})
    return EpisodeScene(d.params, placements, d.target, d.distractor), {"colour": colour}


TOY = Family(name="toy_reach", template="walk up to the {colour} ball", words=(("colour", COLOURS),),
             word_keys={"colour": "ball"}, sample=_sample)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(families, "FAMILIES", dict(families.FAMILIES))
    families.register_family(TOY)
    return TOY


def test_registration_errors_are_one_line():
    with pytest.raises(ValueError, match="already registered"):
        families.register_family(families.get_family("go_to"))
    with pytest.raises(ValueError, match="word 'letter' is not in its template"):
        Family(name="bad", template="go", words=(("letter", ("a",)),), word_keys={"letter": "letter"},
               sample=_sample).validate()


def test_a_new_family_has_instructions_a_code_and_tasks(toy):
    from quadforge.envs.quard.instructions import instruction_table, parse_instruction, quard_tasks, task_families
    assert families.family_names()[-1] == "toy_reach" and families.family_code("toy_reach") == 5
    assert families.family_code("go_through") == 4                        # the old codes stay
    assert "toy_reach" in task_families("quard:all") and "quard:toy_reach" in quard_tasks()
    text = "walk up to the red ball, quickly with a pacing gait"
    assert text in instruction_table() and instruction_table(("toy_reach",))[0].startswith("walk up to the blue ball")
    assert parse_instruction(text.upper()) == {"family": "toy_reach", "colour": "red", "speed": "quickly", "gait": "pacing"}
    swapped = families.swap_instruction(families.sample_episode("toy_reach", np.random.default_rng(0), ("red", "blue")))
    assert swapped.params["instruction"].startswith("walk up to the " + swapped.params["target"]["ball"])


def test_collect_and_the_expert_run_a_new_family(toy, tmp_path):
    from quadforge.collection.collect import CollectConfig, collect_tasks, run_local
    from quadforge.collection.collect_cmd import add_arguments
    from quadforge.data.store import TrajectoryStore

    assert "quard:toy_reach" in collect_tasks()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "quard:toy_reach" in parser.format_help()
    cfg = CollectConfig(out=str(tmp_path / "s"), episodes=2, task="quard:toy_reach", policy="quard_expert",
                        num_envs=2, images=False, progress=False).validate()
    summary = run_local(cfg)
    assert summary["in_store"] == 2
    store = TrajectoryStore.open(tmp_path / "s")
    for e in range(2):
        params = store.task_params(e)
        assert params["family"] == "toy_reach" and params["instruction"].startswith("walk up to the")
    assert bool(store.episodes["success"].all())     # the expert's default behaviour: walk at the target


def test_eval_and_the_report_list_a_new_family(toy, tmp_path):
    from quadforge.evaluation.evaluate_task import TaskEvalConfig, evaluate_task
    from quadforge.tools.quard_report import table3_section

    result = evaluate_task(TaskEvalConfig(task="quard:toy_reach", out=str(tmp_path), colours=("train",),
                                          instructions=("original", "swapped"), episodes=2, num_envs=2, frames=False),
                           log=lambda line: None)
    for rows in (result["families"]["train"], result["swapped"]["train"]):
        assert list(rows) == ["toy_reach"] and rows["toy_reach"]["episodes"] == 2 and rows["toy_reach"]["success"] == 1.0
    results = [{"model": "germ", "failures": True, "round": 0, "seed": 0, "family": f, "successes": 1, "episodes": 2}
               for f in families.family_names()]
    section = "\n".join(table3_section({"run": {}, "steps": [], "results": results}))
    header = next(line for line in section.splitlines() if line.startswith("| model"))
    assert "| toy_reach |" in header
