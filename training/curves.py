"""A run's validation curve on disk: ``OUT/val.jsonl``, one JSON row (``step`` first) per validation.

Written by ``training.loop.RunLog`` on the main rank with or without TensorBoard, read by reports
(``tools/quard_report.py``) without a TensorBoard reader or torch.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

VAL_CURVE = "val.jsonl"


def read_val_curve(out: Path) -> list[dict[str, Any]]:
    """The validation rows a run wrote, oldest first; [] when it wrote none. A torn last line (the run
    killed mid-write) is skipped."""
    path = Path(out) / VAL_CURVE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def restart_val_curve(out: Path, resumed_at: int) -> Path:
    """Start ``OUT/val.jsonl`` for a run beginning at ``resumed_at`` (0: a fresh run, no rows kept): the rows
    up to that checkpoint's step stay, the ones a killed run wrote after it go (the resumed run writes
    them again). Returns the file's path."""
    kept = [r for r in read_val_curve(out) if int(r.get("step", 0)) <= resumed_at] if resumed_at else []
    path = Path(out) / VAL_CURVE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return path


def append_val_row(path: Path, step: int, row: Mapping[str, float]) -> None:
    """One validation's numbers (NaN as null)."""
    plain = {k: (None if math.isnan(float(v)) else float(v)) for k, v in row.items() if k != "step"}
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": int(step), **plain}) + "\n")
