"""A worker for the fault tests: it records its pid, then does what its rank is told.

Usage: ``faults.py OUT_DIR ACTION [ACTION ...]``, action ``i`` for rank ``i``:

- ``flood:MIB``: write MIB MiB of 100-byte lines to stderr, then sleep (a reader that stops
  leaves it blocked in its write);
- ``lines:N``: write N lines of 1 KiB to stdout, then exit 0;
- ``exit:CODE:SECONDS``: sleep, then exit with CODE;
- ``sleep``: sleep until killed;
- ``progress:N``: draw a progress bar of N steps on stdout with carriage returns, a step each
  0.2 s, then end the line.
"""

import os
import sys
import time

out_dir, actions = sys.argv[1], sys.argv[2:]
rank = int(os.environ["RANK"])
# Written whole under its name: the tests read the pids while the workers start.
record = os.path.join(out_dir, f"{rank}.pid")
with open(record + ".part", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(record + ".part", record)
kind, *args = actions[rank].split(":")

if kind == "flood":
    line = b"f" * 99 + b"\n"
    for _ in range(int(args[0]) * (1 << 20) // len(line)):
        os.write(2, line)
    time.sleep(600)
elif kind == "lines":
    for number in range(int(args[0])):
        sys.stdout.write(f"{number:08d} " + "l" * 1014 + "\n")
    sys.stdout.flush()
elif kind == "exit":
    time.sleep(float(args[1]))
    sys.exit(int(args[0]))
elif kind == "sleep":
    time.sleep(600)
elif kind == "progress":
    steps = int(args[0])
    for step in range(steps + 1):
        sys.stdout.write(f"\r{100 * step // steps:3d}%|" + "#" * step)
        sys.stdout.flush()
        time.sleep(0.2)
    sys.stdout.write("\n")
    sys.stdout.flush()
else:
    raise SystemExit(f"unknown action {actions[rank]!r}")
