"""A worker whose last rank leaves a hostile error file and exits 3; the other ranks wait to be stopped.

Usage: ``hostile_error_file.py OUT_DIR KIND``

Every rank records its pid in ``OUT_DIR/<RANK>.ready``. The last rank waits until every rank is
ready, writes one line to stderr (``RuntimeError: the worker's own stderr``, what a report falls
back to), then writes ``TORCHELASTIC_ERROR_FILE`` by KIND and exits 3:

- ``timestamp=VALUE``: a well-formed record whose timestamp is VALUE (``inf``, ``nan``, ``1e20``...).
- ``deep``: JSON nested 100,000 deep.
- ``long``: a record whose traceback is 1 MiB of lines, the last ``RuntimeError: the end of a long traceback``.
- ``huge``: a record of 50 MB (12 MB with ``huge=MB``).
- ``escapes``: a record whose traceback holds terminal escape sequences (none go to stderr).
- ``link``: a symbolic link to ``OUT_DIR/secret.json``, a record that says ``TOP SECRET``.
"""

import json
import os
import sys
import time

out, kind = sys.argv[1], sys.argv[2]
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ESCAPES = "\x1b[2J\x1b]0;retitled\x07\x1b[31mred\r\x9b1mover"


def publish(name: str, text: str) -> None:
    """Readers poll for the file: it appears complete or not at all."""
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.rename(path + ".tmp", path)


def record(traceback: str, timestamp: str | None = None) -> str:
    extra = {"py_callstack": traceback, "timestamp": timestamp or str(int(time.time()))}
    return json.dumps({"message": {"message": "RuntimeError: hostile", "extraInfo": extra}})


def hostile_content() -> str:
    name, _, value = kind.partition("=")
    if name == "timestamp":
        return record("Traceback (most recent call last):\nRuntimeError: odd timestamp", value)
    if name == "deep":
        return '{"message": ' + "[" * 100_000 + "]" * 100_000 + "}"
    if name == "long":
        lines = [f"  frame {number:07d}" for number in range(1024 * 1024 // 16)]
        return record("\n".join(lines) + "\nRuntimeError: the end of a long traceback")
    if name == "huge":
        return record("x" * (int(value or 50) * 1000 * 1000) + "\nRuntimeError: the end of a huge traceback")
    if name == "escapes":
        return record(f"Traceback (most recent call last):\nRuntimeError: {ESCAPES}")
    raise SystemExit(f"unknown kind {kind}")


publish(f"{rank}.ready", str(os.getpid()))
if rank != world_size - 1:
    time.sleep(600)
    raise SystemExit(0)
while not all(os.path.exists(os.path.join(out, f"{other}.ready")) for other in range(world_size)):
    time.sleep(0.02)
print("RuntimeError: the worker's own stderr", file=sys.stderr, flush=True)
error_file = os.environ["TORCHELASTIC_ERROR_FILE"]
if kind == "link":
    secret = os.path.join(out, "secret.json")
    with open(secret, "w") as handle:
        handle.write(record("TOP SECRET"))
    os.symlink(secret, error_file)
else:
    with open(error_file, "w") as handle:
        handle.write(hostile_content())
raise SystemExit(3)
