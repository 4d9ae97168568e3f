#!/usr/bin/env bash
# One entry point that does all set-up itself: creates .venv, installs the pinned CPU torch build first
# (an open torch range with no torch installed would pull a multi-GB CUDA build), then quadforge with
# its test extras, then runs what was asked.
#   tools/dev.sh demo [args]   the end-to-end demo (collect -> train -> evaluate)
#   tools/dev.sh test [args]   the test suite (fast tests; `-m slow` for the long ones)
#   tools/dev.sh <quadforge subcommand> [args]
# Everything runs from the repository root (the shipped checkpoints and docs are named relative to it), so
# relative paths in [args] are the repository's; from elsewhere give absolute ones, or run .venv/bin/quadforge.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${QUADFORGE_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
# Set-up runs under a lock so two first runs at once (a demo and the tests) don't race pip.
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ]; then
    echo "[quadforge] creating virtual environment in $venv" >&2
    "$py" -m venv "$venv"
fi
stamp="$venv/.stamp-quadforge-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "[quadforge] installing torch==2.13.0 (CPU) and quadforge[test]" >&2
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q torch==2.13.0
    "$venv/bin/python" -m pip install -q -e ".[test]"
    touch "$stamp"
fi
flock -u 9
cmd="${1:-demo}"; shift || true
case "$cmd" in
    test) exec "$venv/bin/python" -m pytest "$@" ;;
    *)    exec "$venv/bin/quadforge" "$cmd" "$@" ;;
esac
