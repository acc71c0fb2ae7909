"""A worker that fails its first attempts and then succeeds.

Usage: ``fail_attempts.py OUT_DIR FAILING_ATTEMPTS``

Records each ``TORCHELASTIC_RESTART_COUNT`` it sees in ``OUT_DIR/<RANK>.attempts`` (one a
line), prints it, and while the count is below FAILING_ATTEMPTS, rank 0 exits 5 once every
rank of the attempt has recorded itself (the others wait to be stopped).
"""

import os
import sys
import time

out, failing = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

with open(os.path.join(out, f"{rank}.attempts"), "a") as handle:
    handle.write(f"{attempt}\n")
with open(os.path.join(out, f"{rank}.{attempt}.seen"), "w"):
    pass
print(f"rank {rank} attempt {attempt}")

if attempt < failing:
    if rank == 0:
        while not all(os.path.exists(os.path.join(out, f"{r}.{attempt}.seen")) for r in range(world_size)):
            time.sleep(0.02)
        raise SystemExit(5)
    time.sleep(600)
