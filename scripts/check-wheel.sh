#!/usr/bin/env bash
# The wheel as a user gets it: build it (pip wheel, in an isolated build environment that takes
# the build-system's setuptools from the registry), install it into a fresh virtual environment
# (no editable install; click from the registry, at the version constraints.txt pins), then, from
# a directory outside the source tree, run `xlarun --version` and a two-worker launch of a script
# that prints its RANK: both ranks must print. Usage: scripts/check-wheel.sh [PYTHON] (the
# interpreter that builds the wheel and makes the environment; .venv's by default).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pip-retries.sh
python=${1:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

retried "pip wheel" "$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" .
wheels=("$work"/dist/xlarun-*.whl)
"$python" -m venv "$work/venv"
retried "pip install" "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --constraint constraints.txt "${wheels[@]}"

cd "$work"
# One write per line: the workers share the launcher's stdout (no --tee), and print() under PYTHONUNBUFFERED=1
# writes a line and its newline apart, so that one rank's line could land inside the other's.
cat >ranks.py <<'EOF'
import os

os.write(1, f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\n".encode())
EOF
# Nothing of the source tree may stand in for the installed package.
unset PYTHONPATH
where=$(venv/bin/python -c "import xlarun; print(xlarun.__file__)")
case "$where" in
    "$work"/venv/*) ;;
    *) echo "check-wheel.sh: xlarun was imported from $where, not from the installed wheel" >&2; exit 1 ;;
esac
venv/bin/xlarun --version
output=$(venv/bin/xlarun --nproc_per_node 2 ranks.py)
echo "$output"
for rank in 0 1; do
    if ! grep -qx "rank $rank of 2" <<<"$output"; then
        echo "check-wheel.sh: rank $rank of the installed wheel's two-worker launch printed nothing" >&2
        exit 1
    fi
done
echo "check-wheel.sh: ${wheels[0]##*/} installs and launches two workers"
