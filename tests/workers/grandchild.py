"""A worker that leaves a grandchild behind, for teardown tests.

Usage: ``grandchild.py OUT_DIR MODE``

Every rank starts a child process that sleeps, and records its pid in
``OUT_DIR/<RANK>.grandchild``. Then, by MODE:

- ``exit-then-fail``: rank 0 records its own pid in ``OUT_DIR/0.exited`` and exits 0 at
  once (its grandchild lives on in rank 0's process group); rank 1 waits until rank 0 is
  gone, then exits 1.
- ``exit``: every rank exits 0 at once, leaving its grandchild running.
- ``wait``: every rank records its pid in ``OUT_DIR/<RANK>.ready`` and sleeps until killed.
"""

import os
import subprocess
import sys
import time

out, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])


def publish(name: str, pid: int) -> None:
    """Readers poll for the file: it appears complete or not at all."""
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as handle:
        handle.write(str(pid))
    os.rename(path + ".tmp", path)


def is_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
publish(f"{rank}.grandchild", sleeper.pid)

if mode == "exit-then-fail":
    exited = os.path.join(out, "0.exited")
    if rank == 0:
        publish("0.exited", os.getpid())
        os._exit(0)
    while not os.path.exists(exited):
        time.sleep(0.02)
    with open(exited) as handle:
        first = int(handle.read())
    while not is_gone(first):
        time.sleep(0.02)
    raise SystemExit(1)

if mode == "exit":
    os._exit(0)

publish(f"{rank}.ready", os.getpid())
time.sleep(600)
