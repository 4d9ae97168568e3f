import torch

from quadforge.tools.bench.models import END, START, _replace_block, _targets, matched, step_latencies
from quadforge.models import build_model

torch.set_num_threads(1)


def test_matched_parameter_counts_are_close():
    target = build_model("fcnet", obs_dim=61, context=16, modes=4, hidden=64, num_layers=2).num_parameters()
    for name in ("transformer", "convformer", "mlp"):
        model = matched(name, target, obs_dim=61, context=16, layers=2)
        assert abs(model.num_parameters() - target) / target < 0.1, name


def test_latency_timer_runs_every_model_at_the_window_end():
    models = [build_model("fcnet", obs_dim=5, context=8, modes=2, hidden=8, num_layers=1),
              build_model("transformer", obs_dim=5, context=8, hidden=8, num_heads=2, num_layers=1)]
    times = step_latencies(models, warmup=3, repeats=10, chunk=5)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_docs_block_is_replaced_not_duplicated():
    text = f"# Models\nprose\n\n{START}\nold\n{END}\nafter\n"
    new = _replace_block(text, f"{START}\nnew\n{END}")
    assert "prose" in new and "after" in new and "new" in new and "old" not in new
    assert new.count(START) == 1
    assert _replace_block("# B\n", f"{START}\nx\n{END}").endswith(f"{END}\n")


def test_targets_are_judged_from_the_measurements():
    rows = [dict(context=n, num_layers=4, hidden=256, fcnet_ms=0.3, transformer_ms=0.3 * n / 16)
            for n in (16, 64, 1024)]
    met = {t["target"].split(" (")[0]: t["met"] for t in _targets(rows)}
    assert all(met.values())
    rows[1]["fcnet_ms"] = 0.9
    assert not _targets(rows)[0]["met"]


def test_the_nan_fill_table_times_both_settings_and_leaves_torch_as_it_found_it():
    from quadforge.tools.bench.models import nan_fill_cost
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    models = {"fcnet": (build_model("fcnet", obs_dim=5, context=8, modes=2, hidden=8, num_layers=1), 4)}
    table = nan_fill_cost(models, iters=1, rounds=1)
    (row,) = table.rows
    assert row[0] == "fcnet" and row[2] > 0 and row[3] > 0 and row[4] == row[3] / row[2]
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before
