#!/usr/bin/env bash
# Create or reuse a test environment with xlarun installed (editable), its pinned training stack and
# the test and lint tools (pyproject.toml's dependency groups), at exact versions:
#   scripts/setup-venv.sh        .venv: torch 2.9 and torch_xla 2.9 (constraints.txt)
#   scripts/setup-venv.sh next   .venv-next: the newest torch that installs here, with TorchTPU's
#                                torch_tpu and libtpu, no torch_xla (constraints-next.txt)
# Re-installs only when pyproject.toml or the constraints file changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-xla}" in
    xla) venv=.venv constraints=constraints.txt extra=xla ;;
    next) venv=.venv-next constraints=constraints-next.txt extra=torchtpu ;;
    *) echo "setup-venv.sh: unknown stack ${1} (xla or next)" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp=$venv/.xlarun-installed
wanted=$(sha256sum pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)
. scripts/pip-retries.sh
install_stack() {
    # pip 25.1 is the first to install dependency groups (--group).
    "$venv/bin/python" -m pip install --quiet --upgrade 'pip>=25.1' || return
    local install=("$venv/bin/python" -m pip install --quiet -c "$constraints" -e ".[$extra]" --group dev)
    # A plain path entry ("compat") rather than setuptools' import hook, which costs every
    # launch about 10 ms; newer setuptools may drop compat mode, then the default applies.
    "${install[@]}" --config-settings editable_mode=compat 2>/dev/null || "${install[@]}"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    retried "setup-venv.sh: $venv" install_stack
    echo "$wanted" > "$stamp"
fi
