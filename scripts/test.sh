#!/usr/bin/env bash
# Set up both test stacks (see setup-venv.sh), then test in three stages, each only once the one
# before it passed:
#   1. the gate, in a minute or two: ruff (lint, and the format checked), mypy (xlarun/, scripts/ and tests/; both
#      configured in pyproject.toml) and the unit layer (-m unit: in-process, no launcher started)
#      on the first stack;
#   2. the launch layer on each stack, the stacks side by side, with the 25 slowest tests printed:
#      .venv       torch 2.9 + torch_xla 2.9: every launch test;
#      .venv-next  the newest torch that installs here, with torch_tpu and libtpu and no torch_xla:
#                  its unit layer and every launch test that needs no torch_xla and could differ
#                  from one torch release to the next (markers torch_xla, release_matrix, examples,
#                  slurm, fan_out and torch_free left out, whatever -m selects), with device backends not
#                  autoloaded except where a test asks for them;
#   3. the wheel: built, installed into a fresh virtual environment, and run from there
#      (scripts/check-wheel.sh: xlarun --version and a two-worker launch).
# Extra arguments go to pytest in stages 1 and 2, and leave stage 3 out: scripts/test.sh -m unit
# runs the gate (and the newer stack's unit layer), scripts/test.sh -m "not slurm" skips the Slurm
# cluster.
# XLARUN_TEST_STACKS="xla" (or "next") runs one stack only; the gate runs on the first one named.
# Within a stage every check runs even when one before it failed, so one run reports all of the
# stage; the script then fails with the first failing status. pytest exits 5 when it collected no
# test: that is a failure here, as every other non-zero code, unless the stage's layer is one the
# arguments leave out (a stack's run is a failure when neither layer collected a test).
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
# Open MPI's mpirun, Slurm's scontrol, zsh, tcsh and OpenSSH's sshd for the tests that run them (Debian's packages, as root);
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
stage_passed() {
    if [ "$status" -ne 0 ]; then
        echo "test.sh: stage $1 failed; the stages after it were not run" >&2
        exit "$status"
    fi
}
# Runs pytest on a stack, leaving out the markers given (comma-separated) besides those the stack
# leaves out itself; the rest of the arguments go to pytest.
run_pytest() {
    local stack=$1 leave_out=$2
    shift 2
    case "$stack" in
        xla) XLARUN_TESTS_LEAVE_OUT=$leave_out .venv/bin/python -m pytest "$@" ;;
        next) TORCH_DEVICE_BACKEND_AUTOLOAD=0 \
                  XLARUN_TESTS_LEAVE_OUT=torch_xla,release_matrix,examples,slurm,fan_out,torch_free${leave_out:+,$leave_out} \
                  .venv-next/bin/python -m pytest "$@" ;;
    esac
}

# The release matrix test's torch_xla sources are fetched once into .venv while the gate runs; a
# failure is reported there and makes those tests skip (fail under CI), not the whole run.
fetch=""
if [[ " $stacks " == *" xla "* ]]; then
    { scripts/fetch-torch-xla-sources.sh || true; } >"$logs/sources" 2>&1 &
    fetch=$!
fi

# Stage 1: the gate.
read -r gate _ <<<"$stacks"
checker=.venv/bin/python
[ "$gate" = xla ] || checker=.venv-next/bin/python
code=0; "$checker" -m ruff check --quiet || code=$?; record "$code" "ruff"
code=0; "$checker" -m ruff format --check --quiet || code=$?; record "$code" "ruff format"
code=0; "$checker" -m mypy || code=$?; record "$code" "mypy"
gate_code=0; run_pytest "$gate" launch "$@" || gate_code=$?
[ "$gate_code" -eq 5 ] || record "$gate_code" "the unit layer on the $gate stack"
if [ -n "$fetch" ]; then
    wait "$fetch"
    cat "$logs/sources" >&2
fi
stage_passed 1

# Stage 2: the launch layer on each stack, both stacks at once. Their tests mostly wait (for
# workers to start, for timeouts to pass), so on the 2-core test machine the two side by side took
# about as long as the slower one alone. Each stack's output is printed whole once both ended, a
# failing stack's last, so the end of the output shows what failed.
launch_layer() {
    local stack=$1 code=0
    shift
    if [ "$stack" = "$gate" ]; then
        run_pytest "$stack" unit --durations=25 "$@" || code=$?
        if [ "$code" -eq 5 ] && [ "$gate_code" -ne 5 ]; then
            code=0  # the arguments select the unit layer alone, which the gate ran
        fi
    else
        run_pytest "$stack" "" --durations=25 "$@" || code=$?
    fi
    return "$code"
}
runs=()
for stack in $stacks; do
    launch_layer "$stack" "$@" >"$logs/test-$stack" 2>&1 &
    runs+=("$!:$stack")
done
ended=()
for run in "${runs[@]}"; do
    code=0; wait "${run%%:*}" || code=$?
    ended+=("$code:${run#*:}")
done
for pass in passed failed; do
    for run in "${ended[@]}"; do
        code=${run%%:*}
        if { [ "$pass" = passed ] && [ "$code" -eq 0 ]; } || { [ "$pass" = failed ] && [ "$code" -ne 0 ]; }; then
            cat "$logs/test-${run#*:}"
            record "$code" "pytest on the ${run#*:} stack"
        fi
    done
done
stage_passed 2

# Stage 3: the wheel, installed into a clean environment and run from there; a run narrowed by
# arguments to pytest is a run of those tests alone.
if [ "$#" -eq 0 ]; then
    code=0; scripts/check-wheel.sh "$checker" || code=$?; record "$code" "the wheel check"
fi
exit "$status"
