"""`quadforge bench vla_closed_loop`: a tiny VLA checkpoint deploys on the QUARD envs through the eval code
(the env's instruction table, task and camera reach it) and the benchmark tabulates it beside the expert."""
import json

import pytest
import torch

from quadforge.envs.quard.instructions import instruction_table, task_families
from quadforge.training.vla import default_config, train
from quadforge.training.vla_data import ColourChoiceTask

pytest.importorskip("quadforge.envs.quard.env")

TINY = dict(history=2, d_model=16, tokens_per_frame=4, token_hidden=8, num_layers=1, num_heads=2, ffn_hidden=16,
            word_dim=16, image=dict(stem_channels=8, stages=((8, 2, 2), (16, 2, 2)), expand_ratio=2))


class QuardShapedSource(ColourChoiceTask):
    """ColourChoiceTask's windows at the QUARD camera's 64x64 under a QUARD task's settings, with the task's
    instruction table numbered its own way (reversed), as a store's table is."""

    def __init__(self, task: str = "quard:all", seed: int = 0):
        super().__init__(image_size=64, history=2, seed=seed)
        self.instructions = list(reversed(instruction_table(task_families(task))))
        self.settings = {**self.settings, "task": task}


@pytest.fixture(scope="module")
def tiny_vla(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("checkpoints") / "vla_rt1"
    cfg = default_config("rt1")
    cfg.model.update(TINY)
    cfg.max_steps, cfg.batch_size, cfg.log_every, cfg.val_every, cfg.val_batches = 2, 4, 1, 2, 1
    train(cfg, QuardShapedSource(), out)
    return out / "last.pt"


def test_vla_reads_the_envs_instruction_table_and_checks_its_camera(tiny_vla):
    from quadforge.envs.quard.camera import CameraConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    from quadforge.experts.registry import policy_for_env
    from quadforge.experts.vla import load_vla
    trained = load_vla(tiny_vla, 1)                      # the training table's numbering
    env = QuardEnv(QuardConfig.make("quard:go_avoid", num_envs=1, images=False))
    try:
        vla = policy_for_env(str(tiny_vla), env).high
        assert vla.instruction_table == env.instruction_table != trained.instruction_table
        for j in (0, 5, len(env.instruction_table) - 1):   # the same text embeds alike under either numbering
            k = trained.instruction_table.index(env.instruction_table[j])
            assert torch.allclose(vla.embeddings[j], trained.embeddings[k], atol=1e-6)
    finally:
        env.close()
    small = QuardEnv(QuardConfig.make("quard:go_to", num_envs=1, images=False, camera=CameraConfig(width=32, height=32)))
    try:
        with pytest.raises(ValueError, match="camera height=64"):
            policy_for_env(str(tiny_vla), small)
    finally:
        small.close()


def test_bench_refuses_policy_flags_for_other_benchmarks_and_missing_checkpoints(tmp_path, capsys):
    from quadforge.tools.cli import main
    assert main(["bench", "store", "--quick", "--policy", "x.pt"]) == 2
    assert "bench store takes no --policy" in capsys.readouterr().err
    assert main(["bench", "store", "--quick", "--seed", "1"]) == 2
    assert "bench store takes no --seed" in capsys.readouterr().err
    assert main(["bench", "vla_closed_loop", "--quick", "--policy", str(tmp_path / "none.pt")]) == 2
    assert "none.pt" in capsys.readouterr().err
    for flag in ("--episodes", "--workers", "--num-envs"):   # a given 0 is refused, not read as "the default"
        assert main(["bench", "vla_closed_loop", "--quick", flag, "0"]) == 2
        assert f"{flag} 0: must be" in capsys.readouterr().err
    # a benchmark takes only flags the bench command defines (one list, tools/bench/cli.py)
    import importlib
    from quadforge.tools.bench.cli import BENCHMARK_FLAGS, BENCHMARKS
    for name, module in BENCHMARKS.items():
        options = getattr(importlib.import_module(module), "OPTIONS", ())
        assert set(options) <= set(BENCHMARK_FLAGS), (name, options)


@pytest.mark.slow
def test_bench_tabulates_a_vla_beside_the_expert(tiny_vla, tmp_path, capsys):
    from quadforge.tools.cli import main
    path = tmp_path / "bench.json"
    assert main(["bench", "vla_closed_loop", "--quick", "--policy", str(tiny_vla), "--task", "quard:go_to",
                 "--episodes", "1", "--num-envs", "1", "--seed", "3", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    print(printed)
    assert "| expert seen | expert held-out | expert follows | vla_rt1 seen |" in printed.replace("family | ", "")
    record = json.loads(path.read_text())
    assert record["seed"] == 3
    tables = list(record["tables"].values())
    success, to_original, speed = tables
    assert [r["family"] for r in success] == ["go_to", "all", "colour words"]
    for row in success:
        assert all(0.0 <= row[c] <= 1.0 for c in row if c != "family")
    # go_to names a colour: its row is the whole colour-word pool
    assert {c: v for c, v in success[2].items() if c != "family"} == {c: v for c, v in success[0].items() if c != "family"}
    held_out = record["evaluations"][str(tiny_vla)]["held_out"]
    assert held_out["held_out_colour_words"]["families"] == ["go_to"]
    assert held_out["held_out_colour_words"]["success"] == held_out["families"]["held_out"]["go_to"]["success"]
    assert success[0]["expert follows"] == 1.0          # the privileged expert reads the swapped target
    assert {(r["policy"], r["evaluation"]) for r in speed} == {
        (p, c) for p in ("expert", "vla_rt1") for c in ("seen", "held_out", "swapped")}
    assert all(r["episodes"] == 1 and r["episodes/min"] > 0 for r in speed)
    assert record["policy_ids"]["vla_rt1"].startswith("hier:vla-rt1:")
    swapped = record["evaluations"][str(tiny_vla)]["swapped"]["swapped"]["train"]["go_to"]
    assert swapped["episodes"] == 1 and to_original[0]["vla_rt1 to original"] == swapped["to_original"]
    assert to_original[0]["expert named share"] == 1.0


@pytest.mark.slow
def test_evaluations_in_worker_processes_equal_the_in_process_ones(tiny_vla):
    from quadforge.tools.bench.vla_closed_loop import evaluate_all
    def timeless(rows):   # per family rows without their wall-clock time
        return {k: timeless(v) if isinstance(v, dict) else v for k, v in rows.items() if k != "wall_s"}

    def strip(by):
        return {c: (r["policy_id"], timeless(r["families"]), timeless(r["swapped"])) for c, r in by.items()}
    specs = ["quard_expert", str(tiny_vla)]
    one = evaluate_all(specs, "quard:go_to", episodes=2, num_envs=2, workers=1)
    two = evaluate_all(specs, "quard:go_to", episodes=2, num_envs=2, workers=2)
    assert list(two) == specs
    for spec in specs:
        assert strip(two[spec]) == strip(one[spec])
