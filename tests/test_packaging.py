"""The install: one `quadforge` namespace that a user's own folders cannot shadow."""
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARD_FOLDERS = ("envs", "models", "experts", "collection", "evaluation", "training", "data", "tools")


def test_every_package_folder_is_installed_under_the_namespace():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"quadforge." + ".".join(init.parent.relative_to(ROOT).parts)
             for top in CARD_FOLDERS for init in (ROOT / top).rglob("__init__.py")}
    missing = found - set(config["packages"])
    assert not missing, f"package folders not listed in pyproject.toml [tool.setuptools] packages: {sorted(missing)}"
    assert {config["package-dir"][f"quadforge.{t}"] for t in CARD_FOLDERS} == set(CARD_FOLDERS)


def test_the_command_works_from_a_folder_with_its_own_tools_and_data(tmp_path):
    for name in ("tools", "data", "envs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the user folder was imported')\n")
    script = Path(sys.executable).with_name("quadforge")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "quadforge.tools.cli"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the user's folders first on the path, as in their project
    for args in (["--version"], ["dataset", "--help"]):
        r = subprocess.run(cmd + args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert subprocess.run(cmd + ["--version"], cwd=tmp_path, env=env, capture_output=True,
                          text=True).stdout.startswith("quadforge ")
