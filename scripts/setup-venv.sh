#!/usr/bin/env bash
# Create or reuse .venv with xlarun installed (editable) and its pinned XLA stack and test tools.
# Re-installs only when setup.cfg changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.xlarun-installed
wanted=$(sha256sum setup.cfg setup.py | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # A plain path entry ("compat") rather than setuptools' import hook, which costs every
    # launch about 10 ms; newer setuptools may drop compat mode, then the default applies.
    .venv/bin/python -m pip install --quiet -e '.[xla,test]' --config-settings editable_mode=compat 2>/dev/null ||
        .venv/bin/python -m pip install --quiet -e '.[xla,test]'
    echo "$wanted" > "$stamp"
fi
