#!/usr/bin/env bash
# A real launch: two gloo workers all-reduce their ranks under xlarun, with tee'd, prefixed output.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
exec .venv/bin/xlarun --standalone --nproc_per_node 2 --tee 3 examples/allreduce.py
