#!/usr/bin/env bash
# A real launch: two gloo workers all-reduce their ranks under xlarun, with tee'd, prefixed output;
# then how to run xlarun, which is installed in .venv and not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
command=(.venv/bin/xlarun --standalone --nproc_per_node 2 --tee 3 examples/allreduce.py)
echo "demo.sh: ${command[*]}"
status=0
"${command[@]}" || status=$?
echo "demo.sh: xlarun is .venv/bin/xlarun, not on your PATH: run it by that path, or first" \
     "'source .venv/bin/activate' and then 'xlarun --help'; the README's Quick start goes on from there"
exit "$status"
