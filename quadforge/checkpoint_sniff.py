"""Tell what a checkpoint file is before ``torch.load`` does: a truncated archive, a text file or
random bytes get one line naming the path, what it looks like and what is accepted, instead of a
``KeyError: 101`` or a page of advice about ``weights_only``."""
from __future__ import annotations

import os
import re
import zipfile
import zlib
from pathlib import Path

ACCEPTED = ("accepted: a quadforge checkpoint (quadforge train: last.pt, best.pt, step_<n>.pt), an rsl_rl PPO "
            "checkpoint (model_<it>.pt, quadforge train-expert), a TorchScript actor or walk-these-ways' "
            "body_latest.jit")
ZIP_MAGIC = b"PK\x03\x04"


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text)


def sniff(path: str | os.PathLike) -> str:
    """``zip`` (torch's format), ``pickle`` (torch's legacy format); otherwise ValueError saying why not."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(512)
    if size == 0:
        raise ValueError(f"{p}: not a quadforge/rsl_rl checkpoint (an empty file); {ACCEPTED}")
    if head.startswith(ZIP_MAGIC):
        try:
            with zipfile.ZipFile(p) as z:
                # every member against its CRC-32: torch.load does not check them, so a flipped byte inside
                # a tensor would otherwise load as other weights without a word
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error):
            raise ValueError(f"{p}: truncated or damaged checkpoint (an incomplete zip archive of {size} bytes); "
                             f"{ACCEPTED}") from None
        if bad is not None:
            raise ValueError(f"{p}: damaged checkpoint (member {bad} fails its CRC-32 check: the file changed after "
                             f"it was written); {ACCEPTED}")
        return "zip"
    if head[:1] == b"\x80":  # a pickle stream: torch's legacy (pre-1.6) format
        return "pickle"
    what = "a text file" if _looks_like_text(head[:256]) else f"unknown binary content, first bytes {head[:8]!r}"
    raise ValueError(f"{p}: not a quadforge/rsl_rl checkpoint ({what}); {ACCEPTED}")


def load_error(path: str | os.PathLike, err: BaseException) -> ValueError:
    """The one-line error for a file that passed ``sniff`` but that ``torch.load`` still refused."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if ("cuda" in str(err).lower() and "is_available() is False" in str(err)) or "not compiled with" in str(err) \
            or re.search(r"\bmps\b", text, re.IGNORECASE):
        return ValueError(f"{path}: the checkpoint is fine, but map_location / --device asks for a device this "
                          f"machine does not have ({text[:160]}); load it on cpu")
    if "weights_only" in str(err) or "Unsupported global" in str(err):
        return ValueError(f"{path}: not a quadforge/rsl_rl checkpoint (it pickles Python objects beyond tensors "
                          f"and plain containers, refused for safety); {ACCEPTED}")
    return ValueError(f"{path}: truncated or damaged checkpoint ({type(err).__name__}: {text[:200]}); {ACCEPTED}")
