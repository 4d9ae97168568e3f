"""No merge-conflict markers left in the tracked sources and docs (six branches merge into main)."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7}|>{7})( |$)", re.M)


def test_no_conflict_markers():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "*.sh"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    bad = [f for f in files if (ROOT / f).is_file() and MARKER.search((ROOT / f).read_text(errors="replace"))]
    assert not bad, f"merge-conflict markers in {bad}"
