#!/usr/bin/env bash
# Set up .venv (see setup-venv.sh), type-check xlarun with mypy (configured in setup.cfg), then run
# the test suite. Extra arguments go to pytest: scripts/test.sh -m "not slurm" skips the Slurm cluster.
# pytest runs even when mypy fails, so one run reports both; the script then fails with pytest's
# status, or with mypy's when the tests passed. pytest exits 5 when it collected no test: that is a
# failure here, as every other non-zero code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
# The release matrix test's torch_xla sources, fetched once into .venv; a failure is reported there
# and makes those tests skip (fail under CI), not the whole run.
scripts/fetch-torch-xla-sources.sh || true
mypy_status=0
.venv/bin/python -m mypy || mypy_status=$?
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
if [ "$status" -eq 0 ] && [ "$mypy_status" -ne 0 ]; then
    echo "test.sh: mypy found type errors in xlarun" >&2
    status=$mypy_status
fi
exit "$status"
