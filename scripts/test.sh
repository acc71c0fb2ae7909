#!/usr/bin/env bash
# Set up both test stacks (see setup-venv.sh), lint with ruff and type-check with mypy (both
# configured in pyproject.toml, over xlarun/ and scripts/), then run the test suite on each stack:
#   .venv       torch 2.9 + torch_xla 2.9: the whole suite;
#   .venv-next  the newest torch that installs here, with torch_tpu and libtpu and no torch_xla: every
#               test that needs no torch_xla (markers torch_xla, release_matrix, examples and slurm left
#               out, whatever -m selects),
#               with device backends not autoloaded except where a test asks for them.
# Extra arguments go to pytest on both stacks: scripts/test.sh -m unit runs the unit layer,
# scripts/test.sh -m "not slurm" skips the Slurm cluster. XLARUN_TEST_STACKS="xla" (or "next")
# runs one stack only. Every check runs even when one before it failed, so one run reports
# everything; the script then fails with the first failing status. pytest exits 5 when it
# collected no test: that is a failure here, as every other non-zero code.
set -euo pipefail
cd "$(dirname "$0")/.."
stacks=${XLARUN_TEST_STACKS:-xla next}
# The stacks and the test programs install side by side: each install spends most of its time
# unpacking on one core or waiting on the network. Each one's output is printed when it ends, whole.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
setups=()
for stack in $stacks; do
    scripts/setup-venv.sh "$stack" >"$logs/$stack" 2>&1 &
    setups+=("$!:$stack")
done
# Open MPI's mpirun, Slurm's scontrol, zsh and tcsh for the tests that run them (Debian's packages, as root);
# where they cannot be installed those tests skip, except under CI, where they fail.
{ scripts/install-test-programs.sh || true; } >"$logs/programs" 2>&1 &
setups+=("$!:programs")
failed=0
for setup in "${setups[@]}"; do
    code=0; wait "${setup%%:*}" || code=$?
    cat "$logs/${setup#*:}" >&2
    if [ "$failed" -eq 0 ]; then
        failed=$code
    fi
done
if [ "$failed" -ne 0 ]; then
    exit "$failed"
fi
# The release matrix test's torch_xla sources, fetched once into .venv; a failure is reported there
# and makes those tests skip (fail under CI), not the whole run.
scripts/fetch-torch-xla-sources.sh || true

status=0
record() {
    local code=$1 what=$2
    if [ "$code" -eq 5 ]; then
        echo "test.sh: $what collected no tests" >&2
    elif [ "$code" -ne 0 ]; then
        echo "test.sh: $what failed (exit $code)" >&2
    fi
    if [ "$status" -eq 0 ]; then
        status=$code
    fi
}
checker=.venv/bin/python
[ -x "$checker" ] || checker=.venv-next/bin/python
code=0; "$checker" -m ruff check --quiet || code=$?; record "$code" "ruff"
code=0; "$checker" -m mypy || code=$?; record "$code" "mypy"
for stack in $stacks; do
    code=0
    case "$stack" in
        xla) .venv/bin/python -m pytest "$@" || code=$? ;;
        next) TORCH_DEVICE_BACKEND_AUTOLOAD=0 XLARUN_TESTS_LEAVE_OUT=torch_xla,release_matrix,examples,slurm \
                  .venv-next/bin/python -m pytest "$@" || code=$? ;;
    esac
    record "$code" "pytest on the $stack stack"
done
exit "$status"
