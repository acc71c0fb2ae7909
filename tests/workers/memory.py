"""Touches memory, silently or not, and then exits 0 (unless the kernel ends it first).

Usage: ``memory.py MIB [--step MIB]``: with ``--step``, grows by that much at a time (the OOM
test, whose cgroup limit it crosses); else touches MIB mebibytes at once. Each page is written,
so each is resident.
"""

import sys
import time

total = int(sys.argv[1])
step = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--step" else total
held = []
for _ in range(total // step):
    held.append(b"\x01" * (step * 1024 * 1024))
    time.sleep(0.01)
print(f"touched {sum(len(block) for block in held) >> 20} MiB", flush=True)
