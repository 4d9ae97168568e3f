"""Docs and model cards name no path that exists only on the machine that wrote them (house rule 6):
no /work/..., /root/..., /home/..., /tmp/... - they say how to rebuild the thing instead."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# absolute paths of a machine's own folders; /data/... stays allowed as the docs' placeholder for a big disk
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|home|tmp|mnt|scratch|Users)/[^\s`'\"),\]]*")


def pages():
    return sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "experts" / "checkpoints").glob("*.md")])


def test_docs_and_model_cards_name_no_machine_only_path():
    found = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)}" for p in pages()
             for i, line in enumerate(p.read_text().splitlines(), 1) for m in MACHINE_PATH.finditer(line)]
    assert not found, "machine-only paths (say how to rebuild instead):\n" + "\n".join(found)


def test_the_scan_sees_what_it_should():
    assert len(pages()) > 10 and (ROOT / "experts/checkpoints/MODEL_CARD.md") in pages()
    hits = [m.group(0) for m in MACHINE_PATH.finditer("--demos /work/runs/quard_demos --out /tmp/x/y, `/root/a`")]
    assert hits == ["/work/runs/quard_demos", "/tmp/x/y", "/root/a"]
    assert not MACHINE_PATH.search("tests/data/test_store.py, runs/tmp/x, ~/work/x, --store /data/store")
