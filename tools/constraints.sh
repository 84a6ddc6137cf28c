#!/usr/bin/env bash
# Prints the exact pins of a working venv (every package, pip and the build tools included, Aural itself
# left out) in pip's constraints format: `make constraints` writes packaging/constraints.txt from .venv,
# `tools/constraints.sh bench/.venv > bench/constraints.txt` the benchmark's.  Usage: tools/constraints.sh VENV
set -euo pipefail
venv=${1:?usage: tools/constraints.sh VENV}
echo "# Written by tools/constraints.sh from $(basename "$venv") on $(date -u +%Y-%m-%d) with $("$venv/bin/python" -V)."
echo "# Used as pip -c (and --build-constraint for isolated builds); regenerate after changing a dependency."
"$venv/bin/pip" freeze --all --exclude-editable | grep -v -i -E '^aural[ =@]' | LC_ALL=C sort -f
