"""A worker that runs until the test releases it, then exits with a code of its own.

Usage: ``until_released.py OUT_DIR EXIT_CODE``: writes its pid to ``OUT_DIR/pid_<rank>`` (under a
temporary name, then renamed, so a reader never finds it empty) and ``r<rank> started`` to stdout,
waits for ``OUT_DIR/release``, then writes ``r<rank> released`` and exits with EXIT_CODE.
"""

import os
import sys
import time

out_dir, code = sys.argv[1], int(sys.argv[2])
rank = os.environ["RANK"]
pid_file = os.path.join(out_dir, f"pid_{rank}")
with open(pid_file + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(pid_file + ".tmp", pid_file)
print(f"r{rank} started", flush=True)
while not os.path.exists(os.path.join(out_dir, "release")):
    time.sleep(0.05)
print(f"r{rank} released", flush=True)
sys.exit(code)
