"""Shared benchmark plumbing: timing, a printed table, and a JSON record.

Benchmarks compare ratios measured in one run (this machine is shared and noisy), never absolute
numbers against constants from another day.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from quadforge.cli_flags import write_json


# The bar `quadforge bench` shows while a benchmark runs (rows measured, elapsed time); None outside it.
PROGRESS: Any = None


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median wall time of one call of ``fn`` in seconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def timed_method(obj: Any, name: str, acc: dict[str, float], label: str,
                 clock: Callable[[], float] = time.perf_counter) -> Callable[[], None]:
    """Replace ``obj.name`` by a wrapper adding each call's duration by ``clock`` to ``acc[label]`` (a clock
    that synchronises a device first charges the call its queued kernels); returns the undo, which gives the
    object back the method it had (its class's, or what was set on the instance before)."""
    before = obj.__dict__.get(name)
    fn = getattr(obj, name)

    def timed(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label] += clock() - t0
    setattr(obj, name, timed)

    def undo() -> None:
        if before is None:
            delattr(obj, name)
        else:
            setattr(obj, name, before)
    return undo


def process_memory(key: str) -> int:
    """A /proc/self/status size of this process in bytes (VmRSS: resident now; VmHWM: the peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def device_sync() -> None:
    """Wait for the GPU's queued work where there is a GPU (a no-op on the CPU): what ``sync`` arguments take."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rate_per_second(fn: Callable[[], Any], units: int, calls: int, rounds: int,
                    sync: Callable[[], Any] = lambda: None) -> float:
    """Median units per second over ``rounds`` of ``calls`` calls of ``fn``, each call doing ``units`` (env
    steps x worlds, say); ``sync`` waits for a device's queued work (torch.cuda.synchronize on a GPU)."""
    rates = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        rates.append(calls * units / (time.perf_counter() - t0))
    return statistics.median(rates)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)

    def add(self, *values: Any) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"row has {len(values)} values, table {self.title!r} has {len(self.columns)} columns")
        self.rows.append(list(values))
        if PROGRESS is not None:   # `quadforge bench`'s bar: one tick per measured row
            PROGRESS.update(1)
            PROGRESS.set_postfix_str(str(values[0])[:40], refresh=False)

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def markdown(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, float):
                return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
            return str(v)
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in self.rows]
        return "\n".join(lines)


def report(name: str, tables: list[Table], json_path: str | None, extra: dict[str, Any] | None = None) -> dict:
    """Print every table and, if asked, write them (with machine info) as JSON."""
    for t in tables:
        print(t.markdown())
        print()
    record = {"benchmark": name, "machine": machine_info(), "tables": {t.title: t.records() for t in tables}}
    if extra:
        record.update(extra)
    write_json(json_path, record, default=float)   # '-': stdout, the tables on stderr then (docs/cli.md)
    if json_path and json_path != "-":
        print(f"wrote {json_path}")
    return record
