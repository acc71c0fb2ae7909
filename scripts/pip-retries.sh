# Sourced by setup-venv.sh and fetch-torch-xla-sources.sh. A registry can drop a connection in the
# middle of a download (seen with the 600 MB CUDA wheels that torch 2.9 brings): pip resumes an
# interrupted download (PIP_RESUME_RETRIES, pip 25.1 and newer; older pips ignore the variable),
# and `retried WHAT COMMAND...` runs a failed command again, up to three times in all (pip keeps no
# download cache on the test machine, so a retry downloads its wheels again).
export PIP_RETRIES=${PIP_RETRIES:-10} PIP_TIMEOUT=${PIP_TIMEOUT:-60} PIP_RESUME_RETRIES=${PIP_RESUME_RETRIES:-30}
retried() {
    local what=$1 try
    shift
    for try in 1 2 3; do
        "$@" && return 0
        [ "$try" -lt 3 ] && echo "$what: attempt $try failed, trying again" >&2 && sleep $((10 * try))
    done
    return 1
}
