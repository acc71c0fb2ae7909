"""A worker that writes the lines the ``--duplicate-*-filters`` tests match, then ends.

Usage: ``filtered_lines.py [FAILING_ATTEMPTS MARK_DIR]``

Every line names the worker's rank (``r<RANK>``) and the attempt (``a<TORCHELASTIC_RESTART_COUNT>``).
On stdout: a matching line, one that matches nothing, one ended by CRLF with a comma in it, and a
progress bar that redraws its line with a carriage return. On stderr: one matching line and one not.
While the attempt is below FAILING_ATTEMPTS (default 0), rank 0 then exits 3, once every rank has
written its lines (each marks that in MARK_DIR), so what each attempt wrote is the same every time.
"""

import os
import sys
import time

rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
failing, mark_dir = (int(sys.argv[1]), sys.argv[2]) if len(sys.argv) > 2 else (0, "")
tag = f"r{rank} a{attempt}"
sys.stdout.write(
    f"{tag} loss=1.5 step 1\n{tag} nothing to see\n{tag} acc, top1\r\n{tag} progress 10%\r{tag} progress 20% loss\n"
)
sys.stdout.flush()
sys.stderr.write(f"{tag} warning: loss spike\n{tag} fine\n")
sys.stderr.flush()
if attempt < failing:
    open(os.path.join(mark_dir, f"{rank}.{attempt}"), "w").close()
    if rank == "0":
        marks = [os.path.join(mark_dir, f"{other}.{attempt}") for other in range(int(os.environ["WORLD_SIZE"]))]
        while not all(os.path.exists(mark) for mark in marks):
            time.sleep(0.01)
        raise SystemExit(3)
