#!/usr/bin/env bash
# Fetch the Python set-up code of every torch_xla release the release matrix test runs
# (tests/launch/test_release_matrix.py) into .venv/torch-xla-sources/<version>/, once.
#
# Each release's wheel is downloaded from the package index with pip, for CPython 3.10 on
# manylinux_2_28 x86_64 (the one tag every release from 2.1 to 2.9 is published for), and only
# the few Python files the test runs are kept, with the wheel's entry points; the wheel itself
# (80 to 110 MB) is deleted at once, so the cache holds about 1 MB per release. A release that
# cannot be fetched (offline, index down) is reported and left out: the test then skips it,
# or fails under CI, where a missing release must not pass unnoticed.
set -uo pipefail
cd "$(dirname "$0")/.."

RELEASES=(2.1.0 2.2.0 2.3.0 2.4.0 2.5.1 2.6.0 2.7.0 2.8.1 2.9.0)
CACHE=.venv/torch-xla-sources
FILES=(
    torch_xla/__init__.py torch_xla/version.py torch_xla/runtime.py
    torch_xla/core/__init__.py torch_xla/core/xla_env_vars.py
    torch_xla/utils/__init__.py torch_xla/utils/utils.py
    torch_xla/distributed/__init__.py torch_xla/experimental/plugins.py
    torch_xla/_internal/__init__.py torch_xla/_internal/utils.py torch_xla/_internal/pjrt.py
    torch_xla/_internal/rendezvous.py torch_xla/_internal/tpu.py torch_xla/_internal/gpu.py
    torch_xla/_internal/neuron.py torch_xla/_internal/neuron_utils.py torch_xla/_internal/xpu.py
)

. scripts/pip-retries.sh
download_wheel() {
    .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.10 \
        --platform manylinux_2_28_x86_64 --dest "$2" "torch_xla==$1"
}

status=0
for release in "${RELEASES[@]}"; do
    target="$CACHE/$release"
    [ -f "$target/COMPLETE" ] && continue
    download=$(mktemp -d)
    if retried "fetch-torch-xla-sources: torch_xla $release" download_wheel "$release" "$download" \
        && .venv/bin/python - "$download" "$target" "${FILES[@]}" <<'PYTHON'
import pathlib, shutil, sys, zipfile

download, target, wanted = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), set(sys.argv[3:])
(wheel,) = download.glob("torch_xla-*.whl")
shutil.rmtree(target, ignore_errors=True)
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name in wanted:
            archive.extract(name, target)
        elif name.endswith(".dist-info/entry_points.txt"):
            (target / "entry_points.txt").write_bytes(archive.read(name))
(target / "COMPLETE").write_text(wheel.name + "\n")
PYTHON
    then
        echo "fetch-torch-xla-sources: torch_xla $release ready in $target"
    else
        echo "fetch-torch-xla-sources: could not fetch torch_xla $release; its matrix tests skip (fail under CI)" >&2
        status=1
    fi
    rm -rf "$download"
done
exit "$status"
