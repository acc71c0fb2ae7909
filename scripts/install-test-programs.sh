#!/usr/bin/env bash
# Install the programs some tests run that pip cannot bring: Open MPI's mpirun (Debian's
# openmpi-bin). Needs root and apt-get; does nothing when mpirun is already on PATH.
set -euo pipefail
command -v mpirun >/dev/null && exit 0
say() { echo "install-test-programs: $*" >&2; }
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    say "cannot install openmpi-bin (needs root and apt-get): the mpirun test will skip"
    exit 3
fi
log=$(mktemp)
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin >>"$log" 2>&1; }
# Stale package lists are refreshed once, only when the install cannot find the package.
if ! install && ! { apt-get update >>"$log" 2>&1 && install; }; then
    say "apt-get could not install openmpi-bin: $(tail -n 1 "$log")"
    rm -f "$log"
    exit 3
fi
rm -f "$log"
