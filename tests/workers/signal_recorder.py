"""A worker that records every signal it receives and runs until told to stop.

Usage: ``signal_recorder.py OUT_DIR [--ignore-term] [--fail-rank R --code C]``

- Appends each received signal's name to ``OUT_DIR/<RANK>.signals``.
- Writes ``OUT_DIR/<RANK>.ready`` (its pid) once its handlers are installed.
- SIGUSR1/SIGUSR2 are only recorded. SIGTERM, SIGINT, SIGHUP and SIGQUIT are recorded and
  then kill the worker with that same signal, unless ``--ignore-term`` keeps it alive
  through SIGTERM (so only SIGKILL ends it).
- ``--fail-rank R --code C``: rank R exits with code C once every rank is ready.
- Every worker exits 0 when ``OUT_DIR/finish`` appears.
"""

import argparse
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--fail-rank", type=int)
parser.add_argument("--code", type=int, default=1)
args = parser.parse_args()

rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def record(number: int, frame: object) -> None:
    with open(os.path.join(args.out, f"{rank}.signals"), "a") as handle:
        handle.write(signal.Signals(number).name + "\n")
    if number in STOPPING and not (args.ignore_term and number == signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)


for number in STOPPING + (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(number, record)

# Written whole under its name: the tests read the pid once the file appears.
ready = os.path.join(args.out, f"{rank}.ready")
with open(ready + ".part", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(ready + ".part", ready)


def everyone_ready() -> bool:
    return all(os.path.exists(os.path.join(args.out, f"{r}.ready")) for r in range(world_size))


while not os.path.exists(os.path.join(args.out, "finish")):
    if args.fail_rank == rank and everyone_ready():
        raise SystemExit(args.code)
    time.sleep(0.02)
