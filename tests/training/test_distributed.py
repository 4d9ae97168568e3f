import socket

import torch
import torch.multiprocessing as mp

from quadforge.training.distributed import DistInfo, all_reduce_mean, init_distributed, wrap_model
from quadforge.training.presets import preset

from imitation_data import ddp_worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = init_distributed("cpu")
    assert info == DistInfo() and not info.enabled and info.is_main
    model = torch.nn.Linear(2, 2)
    assert wrap_model(model, info) is model
    assert all_reduce_mean(torch.tensor(3.0), info) == 3.0


def test_two_cpu_ranks_end_with_identical_weights(tmp_path):
    cfg = preset("fcnet", "cpu")
    cfg.max_steps, cfg.batch_size, cfg.context, cfg.val_every, cfg.log_every = 6, 16, 8, 6, 3
    cfg.tensorboard = False
    cfg.model_config = dict(modes=3, hidden=16, num_layers=1, decoder_hidden=16)
    mp.spawn(ddp_worker, args=(2, _free_port(), str(tmp_path), cfg.to_dict()), nprocs=2, join=True)
    w0, w1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    # and training moved them: not the initial weights
    from quadforge.models import build_model
    torch.manual_seed(0)
    assert (tmp_path / "last.pt").exists()
    init = build_model("fcnet", obs_dim=61, action_dim=12, context=8, **cfg.model_config).state_dict()
    assert any(not torch.equal(init[k], w0[k]) for k in w0 if k in init and init[k].shape == w0[k].shape)
