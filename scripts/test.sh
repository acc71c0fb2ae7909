#!/usr/bin/env bash
# Set up .venv (see setup-venv.sh) and run the whole test suite. Extra arguments go to pytest.
# pytest exits 5 when it collected no test: that is a failure here, as every other non-zero code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
fi
exit "$status"
