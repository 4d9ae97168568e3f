"""Small tensor helpers every layer shares: the device a caller names checked against this machine, a range
check of integer tensors a user's data or checkpoint hands in (a one-line ``ValueError``), the row ids a caller hands an env or a policy (indices or a bool
mask), the row write of a state buffer that ``torch.inference_mode`` may have made, the small
constants made once per device, a host-to-GPU copy that does not wait for the GPU, and what
torch.compile needs from the code it traces (writes into views, a C++ compiler on the CPU)."""
from __future__ import annotations

import functools

import torch


DEVICE_KINDS = ("cpu", "cuda")


def check_device(device: str | torch.device, what: str = "device") -> torch.device:
    """``device`` as a torch.device this machine has; otherwise a one-line ValueError naming ``what``
    (torch would say "Torch not compiled with CUDA enabled" from deep inside the first copy)."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        d = None
    if d is None or d.type not in DEVICE_KINDS:
        raise ValueError(f"{what} {str(device)!r} is unknown; allowed: cpu, cuda, cuda:N")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{what} {str(device)!r}: this machine has no CUDA GPU torch can use "
                             f"(torch.cuda.is_available() is False); use cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"{what} {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return d


def check_index_range(idx: torch.Tensor, size: int, what: str, of: str = "") -> None:
    """Every value of ``idx`` lies in [0, size); otherwise a ValueError naming ``what``, what the indices
    point into (``of``) and the range found. The minimum and maximum come back in one read (on a GPU,
    one sync instead of two)."""
    lo, hi = torch.stack(torch.aminmax(idx)).tolist() if idx.numel() else (0, 0)
    if lo < 0 or hi >= size:
        raise ValueError(f"{what} must be in [0, {size})" + (f" ({of})" if of else "") + f", got [{lo}, {hi}]")


def set_rows(buf: torch.Tensor, rows, value) -> torch.Tensor:
    """``buf`` with ``buf[rows] = value`` written, in place where torch allows it; returns the buffer to
    keep. A buffer made under ``torch.inference_mode`` (rsl_rl's runner steps envs in it, a user's
    evaluation loop may act in it) cannot be written in place outside that mode: it is copied first, so
    an env or policy works in or out of the mode whatever the mode of its earlier calls."""
    if buf.is_inference() and not torch.is_inference_mode_enabled():
        buf = buf.clone()
    buf[rows] = value
    return buf


def row_ids(ids, n: int, device: torch.device | str, what: str = "env_ids",
            check_range: bool | str = True) -> torch.Tensor:
    """Rows of an (n, ...) batch as a (k,) int64 tensor on ``device``, from what a caller may hand in:
    None (every row), an int, a list, a numpy array or a tensor of integer indices, or an (n,) bool mask
    (its True rows; torch would otherwise read a mask as the indices 0 and 1). Fractional ids are a
    ValueError; ``check_range``: so are ids outside [0, n) (a negative id would otherwise wrap to the
    batch's end). ``check_range="host"``: checked when the ids are on the host (a list, numpy, a CPU
    tensor), where it is free, not when they are already on a GPU, where it is a host read (a policy's
    reset in a rollout's loop gets the done envs' ids there each step)."""
    if ids is None:
        return torch.arange(n, device=device)
    t = torch.as_tensor(ids)
    if t.dtype == torch.bool:
        if tuple(t.shape) != (n,):
            raise ValueError(f"{what}: a bool mask must have shape ({n},), got {tuple(t.shape)}")
        return t.to(device).nonzero(as_tuple=True)[0]
    if t.numel() == 0:   # [] reads as an empty float tensor: no rows, not a dtype error
        return torch.zeros(0, dtype=torch.long, device=device)
    if t.is_floating_point() or t.is_complex():
        raise ValueError(f"{what} must be integer indices or a ({n},) bool mask, got dtype {t.dtype}")
    t = t.reshape(-1).long()
    if check_range is True or (check_range == "host" and t.device.type == "cpu"):
        check_index_range(t, n, what)
    return t.to(device)


def constant_cache(fn):
    """``functools.lru_cache`` for a function of hashable arguments that makes constants, made to run under
    ``torch.compile`` too: there the function itself runs (traced into the graph once), since Dynamo would
    trace past the cache anyway, with a warning."""
    cached = functools.lru_cache(maxsize=1024)(fn)

    @functools.wraps(fn)
    def call(*args):
        return fn(*args) if torch.compiler.is_compiling() else cached(*args)
    return call


@constant_cache
def device_constant(values: tuple, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.tensor(values)`` on ``device``, made once per (values, dtype, device) and shared: read-only.
    For the small constants a policy or layout uses every control step, which made afresh each time cost
    a blocking host-to-device copy each on a GPU. Made outside inference mode, so autograd can use it too."""
    with torch.inference_mode(False):
        return torch.tensor(values, dtype=dtype, device=device)


def from_host(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t.to(device)``, and for a CPU tensor going to a GPU without making the host wait: a copy to a GPU
    from ordinary (pageable) memory blocks until the GPU's queue drains, one from pinned memory does not
    (torch keeps the pinned block until the copy is done)."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def into(op, *args, out: torch.Tensor, **kwargs) -> torch.Tensor:
    """``op(*args, out=out, **kwargs)``: the result written into ``out`` (often a column view of a
    larger buffer). Under ``torch.compile`` the same write as a copy, since Dynamo cannot trace ``out=``
    into a strided view; eagerly the one call with ``out=``, the same bits either way."""
    if torch.compiler.is_compiling():
        return out.copy_(op(*args, **kwargs))
    return op(*args, out=out, **kwargs)


def check_cpp_compiler(what: str) -> None:
    """``torch.compile`` on the CPU builds C++ kernels: a RuntimeError naming ``what`` asked for it when no
    working compiler is found (torch's own check, ``torch._inductor.config.cpp.cxx`` / ``$CXX``)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
    except Exception as e:   # torch's InvalidCxxCompiler, or a torch without this check
        raise RuntimeError(f"{what} compiles with torch.compile, which on the CPU needs a C++ compiler: {e}. "
                           f"Install one (g++, or set CXX) or leave it off.") from e


def check_compiler(what: str, device: torch.device | str) -> None:
    """``torch.compile``'s kernel compiler for ``device``: a C++ compiler on the CPU
    (``check_cpp_compiler``), Triton on a GPU; a RuntimeError naming ``what`` asked for it when it is
    missing, before any work, not torch's own error at the first compiled call."""
    if torch.device(device).type == "cpu":
        check_cpp_compiler(what)
        return
    from torch.utils._triton import has_triton
    if not has_triton():
        raise RuntimeError(f"{what} compiles with torch.compile, which on a GPU needs Triton (torch "
                           f"{torch.__version__} names the version it wants) and found none: install it or leave "
                           f"it off.")
