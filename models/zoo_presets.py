"""The imitation zoo's training presets, each model's given with its registration (``models.registry``:
``ModelSpec.presets``): per preset name, ``training.presets.TrainConfig`` fields as plain data (the trainer
types them), so the model list stays one registry.

``paper`` presets follow the seeds: FCNet seed 000 Table 5 (legged dataset), the Transformer baseline
Table 6 (Lion, same lr; hidden 128 so its parameter count matches FCNet's ~790k as the paper requires),
Decision ConvFormer seed 002 Table 4 (MuJoCo settings: 3 layers, embed 128, K 8, clip 0.25, wd 1e-4,
lr 1e-3, batch 64), StARformer seed 004 (its DT-derived settings: lr 6e-4, betas (0.9, 0.95), wd 0.1,
clip 1.0, context 30). Where a seed gives no number the choice is ours and marked "ours".
``cpu``: small widths and a few hundred steps, for smoke runs on a laptop-class CPU. Its optimizer
settings are the equal-budget sweep's choice (``quadforge train-sweep``, issue 17; the table is in
docs/models.md "Equal-budget tuning"): every model got the same grid - AdamW lr {3e-4, 1e-3, 3e-3},
Lion at a third of those - then two values of its paper's key setting, 500 steps, batch 64, one 24-episode
flat store and split. AdamW at 3e-3 won for every model; of the paper settings only StARformer's
positional-embedding init moved (N(0, 1) beat N(0, 0.02) by 7 %).
"""
from __future__ import annotations

from typing import Any

# the sweep's AdamW (torch's standard betas/eps, the same for every model) at its chosen lr
SWEPT_ADAMW = dict(name="adamw", lr=3e-3, betas=(0.9, 0.999), eps=1e-8)

_FCNET_OPTIM = dict(name="adamw", lr=5e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4, warmup_frac=0.2,
                    grad_clip=1.0)   # grad_clip: ours (the paper gives none)

ZOO_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "fcnet": {
        "paper": dict(context=64, batch_size=1024, epochs=50,
                      model_config=dict(modes=10, hidden=256, num_layers=4, decoder_hidden=128),
                      optim=_FCNET_OPTIM),
        "cpu": dict(context=32, batch_size=64, max_steps=300, val_every=100,
                    model_config=dict(modes=8, hidden=64, num_layers=2, decoder_hidden=64),   # m 16: within 1 %
                    optim={**_FCNET_OPTIM, **SWEPT_ADAMW}),
    },
    "transformer": {
        "paper": dict(context=64, batch_size=1024, epochs=50,
                      model_config=dict(hidden=128, num_layers=4, num_heads=4, decoder_hidden=128),  # heads: ours
                      optim=dict(name="lion", lr=5e-3, betas=(0.9, 0.99), weight_decay=1e-4, warmup_frac=0.2,
                                 grad_clip=1.0)),
        "cpu": dict(context=32, batch_size=64, max_steps=300, val_every=100,
                    # pos_init_std 0.02 (GPT-2's); torch's N(0, 1) default was 10 % worse in the sweep
                    model_config=dict(hidden=32, num_layers=2, num_heads=2, decoder_hidden=64, pos_init_std=0.02),
                    optim=dict(**SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.2, grad_clip=1.0)),
    },
    "convformer": {
        "paper": dict(context=8, batch_size=64, max_steps=100_000,
                      model_config=dict(hidden=128, num_layers=3, kernel=6, decoder_hidden=128, use_actions=True),
                      optim=dict(name="adamw", lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4, warmup_frac=0.1,
                                 grad_clip=0.25)),
        "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,
                    model_config=dict(hidden=32, num_layers=2, kernel=6, decoder_hidden=64, use_actions=True),
                    optim=dict(**SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.1, grad_clip=0.25)),
    },
    "starformer": {
        "paper": dict(context=30, batch_size=64, max_steps=100_000,
                      model_config=dict(hidden=128, local_dim=16, num_layers=3, num_heads=4, local_heads=2,
                                        decoder_hidden=128, use_actions=True),
                      optim=dict(name="adamw", lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, warmup_frac=0.1,
                                 grad_clip=1.0)),
        "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,   # batch 64: the sweep's, as everyone's
                    model_config=dict(hidden=32, local_dim=8, num_layers=2, num_heads=2, local_heads=2,
                                      decoder_hidden=64, use_actions=True, pos_init_std=1.0),   # 0.02: 7 % worse
                    optim=dict(**SWEPT_ADAMW, weight_decay=0.1, warmup_frac=0.1, grad_clip=1.0)),
    },
    "mlp": {   # no seed: ours
        "paper": dict(context=8, batch_size=1024, epochs=50,
                      model_config=dict(hidden=256, num_layers=2, decoder_hidden=128),
                      optim=dict(name="adamw", lr=1e-3, weight_decay=1e-4, warmup_frac=0.1, grad_clip=1.0)),
        "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,
                    model_config=dict(hidden=64, num_layers=2, decoder_hidden=64),   # context 16: within 2 %
                    optim=dict(**SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.1, grad_clip=1.0)),
    },
}
