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
# A registry can drop a connection in the middle of a download (seen with the 600 MB CUDA wheels
# that torch 2.9 brings). pip resumes an interrupted download (PIP_RESUME_RETRIES, pip 25.1 and
# newer; older pips ignore the variable), and a failed install runs again, up to three times in
# all: the wheels that did arrive stay in pip's cache.
export PIP_RETRIES=${PIP_RETRIES:-10} PIP_TIMEOUT=${PIP_TIMEOUT:-60} PIP_RESUME_RETRIES=${PIP_RESUME_RETRIES:-30}
retried() {
    local try
    for try in 1 2 3; do
        "$@" && return 0
        [ "$try" -lt 3 ] && echo "setup-venv.sh: $venv: attempt $try failed, trying again" >&2 && sleep $((10 * try))
    done
    return 1
}
install_stack() {
    # pip 25.1 is the first to install dependency groups (--group).
    "$venv/bin/python" -m pip install --quiet --upgrade 'pip>=25.1' || return
    local install=("$venv/bin/python" -m pip install --quiet -c "$constraints" -e ".[$extra]" --group dev)
    # A plain path entry ("compat") rather than setuptools' import hook, which costs every
    # launch about 10 ms; newer setuptools may drop compat mode, then the default applies.
    "${install[@]}" --config-settings editable_mode=compat 2>/dev/null || "${install[@]}"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    retried install_stack
    echo "$wanted" > "$stamp"
fi
