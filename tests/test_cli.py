import subprocess
import sys

from tools.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_an_error(capsys):
    assert main(["no-such-command"]) == 2


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "tools.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "quadforge" in r.stdout
