"""Closes descriptors as a checkpointing or daemonizing program may, opens its own file, and waits.

Usage: ``descriptors.py OUT_DIR MODE``; the file is ``OUT_DIR/checkpoint.bin``, and MODE says what
comes before it is opened:

- ``keep``: nothing;
- ``reuse``: descriptors 3-255 are closed, so the file takes the lowest number, one that something
  else held before;
- ``fill``: every descriptor from 3 on is closed, and the file is held at every number below 4096
  that the limit on open files allows.

Writes ``weights`` to the file, then ``OUT_DIR/ready``, and exits when ``OUT_DIR/release`` appears.
"""

import os
import resource
import sys
import time

out_dir, mode = sys.argv[1], sys.argv[2]
if mode == "reuse":
    os.closerange(3, 256)
elif mode == "fill":
    os.closerange(3, 1 << 20)
checkpoint = os.open(os.path.join(out_dir, "checkpoint.bin"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
if mode == "fill":
    for number in range(checkpoint + 1, min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0])):
        os.dup2(checkpoint, number)
os.write(checkpoint, b"weights")
open(os.path.join(out_dir, "ready"), "w").close()
while not os.path.exists(os.path.join(out_dir, "release")):
    time.sleep(0.05)
