"""envs.fast_paths.cpu_arrays: numpy views of CPU tensors, or None where torch's own path must run."""
import torch

from quadforge.envs.fast_paths import cpu_arrays


def test_views_share_memory_and_none_passes_through():
    a, b = torch.zeros(3), torch.ones(2, 4, dtype=torch.bool)
    x, none, y = cpu_arrays(a, None, b)
    assert none is None and y.dtype == bool
    x[1] = 5.0
    assert a[1] == 5.0   # same memory


def test_autograd_and_bfloat16_take_the_torch_path():
    assert cpu_arrays(torch.zeros(2), torch.zeros(2, requires_grad=True)) is None
    assert cpu_arrays(torch.zeros(2, dtype=torch.bfloat16)) is None
