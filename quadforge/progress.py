"""One progress bar for every long command (train, eval, reproduce): tqdm on stderr with the rate
and the ETA, shown on a terminal and silent in logs and tests (tqdm's ``disable=None``)."""
from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def progress_bar(total: int | None, initial: int = 0, desc: str = "", unit: str = "step", enabled: bool = True,
                 **kwargs: Any) -> tqdm:
    """A bar from ``initial`` to ``total`` ``unit``s (None: a counter with the rate, no ETA);
    ``enabled=False`` (e.g. a non-main rank) hides it."""
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=None if enabled else True,
                file=sys.stderr, dynamic_ncols=True, smoothing=0.05, **kwargs)
