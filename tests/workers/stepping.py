"""A worker that steps as torch_xla's step log shows it, each rank at its own pace, until the test releases it.

Usage: ``stepping.py OUT_DIR SECONDS_PER_STEP...``: rank N takes the Nth pace. Writes its pid to
``OUT_DIR/pid_<rank>`` (under a temporary name, then renamed), then prints torch_xla's step line on
stderr once a step until ``OUT_DIR/release`` exists, and exits 0.
"""

import os
import sys
import time

out_dir, paces = sys.argv[1], sys.argv[2:]
rank = int(os.environ["RANK"])
pid_file = os.path.join(out_dir, f"pid_{rank}")
with open(pid_file + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(pid_file + ".tmp", pid_file)
while not os.path.exists(os.path.join(out_dir, "release")):
    sys.stderr.write("torch_xla.torch_xla::sync\n")
    sys.stderr.flush()
    time.sleep(float(paces[rank]))
