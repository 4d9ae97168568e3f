"""docs/cli.md names exactly the commands, dataset actions and benchmarks the CLI's registries hold."""
import re
from pathlib import Path

from quadforge.data.cli import ACTIONS
from quadforge.tools.bench.cli import BENCHMARKS
from quadforge.tools.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def _commands_table() -> dict[str, list[str]]:
    """command -> the sub-names its row lists (``bench a|b|c``), from the table under "## The commands"."""
    doc = (ROOT / "docs" / "cli.md").read_text()
    section = doc[doc.index("## The commands"):]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([\w-]+)((?: [^`]*)?)` \|", line)
        if m:
            rows[m.group(1)] = [n for n in m.group(2).replace("\\|", "|").strip().split("|") if n]
    return rows


def test_docs_list_exactly_the_commands_actions_and_benchmarks():
    rows = _commands_table()
    assert set(rows) == set(COMMANDS), "docs/cli.md's command table vs tools/cli.py COMMANDS"
    assert sorted(rows["dataset"]) == sorted(ACTIONS), "docs/cli.md's dataset row vs data/cli.py ACTIONS"
    assert sorted(rows["bench"]) == sorted(BENCHMARKS), "docs/cli.md's bench row vs tools/bench/cli.py BENCHMARKS"


def test_the_help_names_every_benchmark():
    help_text = build_parser().format_help()
    for name in BENCHMARKS:
        assert name in help_text, name
