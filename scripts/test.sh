#!/usr/bin/env bash
# Set up .venv (see setup-venv.sh), lint with ruff and type-check with mypy (both configured in
# pyproject.toml, over xlarun/ and scripts/), then run the test suite. Extra arguments go to pytest:
# scripts/test.sh -m "not slurm" skips the Slurm cluster, scripts/test.sh -m unit runs the unit layer.
# pytest runs even when a check fails, so one run reports everything; the script then fails with
# pytest's status, or with the checks' when the tests passed. pytest exits 5 when it collected no
# test: that is a failure here, as every other non-zero code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
# The release matrix test's torch_xla sources, fetched once into .venv; a failure is reported there
# and makes those tests skip (fail under CI), not the whole run.
scripts/fetch-torch-xla-sources.sh || true
# Open MPI's mpirun and Slurm's scontrol for the tests that run them (Debian's packages, as root);
# where they cannot be installed those tests skip, except under CI, where they fail.
scripts/install-test-programs.sh || true
check_status=0
.venv/bin/python -m ruff check --quiet || check_status=$?
.venv/bin/python -m mypy || check_status=$?
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
if [ "$status" -eq 0 ] && [ "$check_status" -ne 0 ]; then
    echo "test.sh: ruff or mypy found problems in xlarun/ or scripts/" >&2
    status=$check_status
fi
exit "$status"
