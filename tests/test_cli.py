import subprocess
import sys

from quadforge.tools.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_a_one_line_error(capsys):
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1 and "no-such-command" in err.err


def test_version_is_one_line(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("quadforge ")


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "quadforge.tools.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "quadforge" in r.stdout
