#!/usr/bin/env bash
# Create or reuse .venv with xlarun installed (editable), its pinned XLA stack and the test and lint
# tools (pyproject.toml's dependency groups), at the exact versions of constraints.txt.
# Re-installs only when pyproject.toml or constraints.txt changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.xlarun-installed
wanted=$(sha256sum pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    # pip 25.1 is the first to install dependency groups (--group).
    .venv/bin/python -m pip install --quiet --upgrade 'pip>=25.1'
    install=(.venv/bin/python -m pip install --quiet -c constraints.txt -e '.[xla]' --group dev)
    # A plain path entry ("compat") rather than setuptools' import hook, which costs every
    # launch about 10 ms; newer setuptools may drop compat mode, then the default applies.
    "${install[@]}" --config-settings editable_mode=compat 2>/dev/null || "${install[@]}"
    echo "$wanted" > "$stamp"
fi
