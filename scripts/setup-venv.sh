#!/usr/bin/env bash
# Create or reuse a test environment with xlarun installed (editable), its pinned training stack and
# the test and lint tools (pyproject.toml's dependency groups), at exact versions:
#   scripts/setup-venv.sh        .venv: torch 2.9 and torch_xla 2.9 (constraints.txt)
#   scripts/setup-venv.sh next   .venv-next: the newest torch that installs here, with TorchTPU's
#                                torch_tpu and libtpu, no torch_xla (constraints-next.txt)
# Re-installs only when pyproject.toml or the constraints file changed since the last successful install.
# Each step is one line on stdout; pip's own lines and download bars show where stdout is a terminal,
# and a log (CI, scripts/test.sh) gets the step lines alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# size: the environment as installed, measured on the test machine; the download is about half of it.
case "${1:-xla}" in
    xla) venv=.venv constraints=constraints.txt extra=xla size="7.4 GB" ;;
    next) venv=.venv-next constraints=constraints-next.txt extra=torchtpu size="6.6 GB" ;;
    *) echo "setup-venv.sh: unknown stack ${1} (xla or next)" >&2; exit 2 ;;
esac
step() { echo "setup-venv.sh: $*"; }
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
    step "creating $venv ($python -m venv)"
    "$python" -m venv "$venv"
fi
stamp=$venv/.xlarun-installed
wanted=$(sha256sum pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)
. scripts/pip-retries.sh
if [ -t 1 ]; then quiet=(); else quiet=(--quiet); fi
# The training stack's packages, as pinned: "torch 2.9.0, torch_xla 2.9.0".
stack=$(sed -n 's/^\(torch[a-z_]*\|libtpu\)==/\1 /p' "$constraints" | paste -sd, - | sed 's/,/, /g')
install_stack() {
    # pip 25.1 is the first to install dependency groups (--group).
    step "upgrading pip in $venv"
    "$venv/bin/python" -m pip install --quiet --upgrade 'pip>=25.1' || return
    step "installing xlarun (editable) with $stack, transformers, accelerate and the test and lint tools" \
         "($constraints): about $size in $venv, a few minutes on a fast link, the first time"
    local install=("$venv/bin/python" -m pip install "${quiet[@]}" -c "$constraints" -e ".[$extra]" --group dev)
    # A plain path entry ("compat") rather than setuptools' import hook, which costs every
    # launch about 10 ms; newer setuptools may drop compat mode, then the default applies.
    "${install[@]}" --config-settings editable_mode=compat 2>/dev/null || "${install[@]}"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    retried "setup-venv.sh: $venv" install_stack
    echo "$wanted" > "$stamp"
    step "$venv is ready"
else
    step "$venv is up to date (pyproject.toml and $constraints unchanged since it was installed)"
fi
