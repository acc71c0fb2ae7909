"""Runs a training script; when it raises SplitWorldError, records it and waits for every worker to.

    xla_split_world.py OUT_DIR SCRIPT [ARGS...]

The launcher stops the other workers as soon as one fails, so without waiting only the
first to fail would be sure to reach its check. Each worker writes its error to
``OUT_DIR/<RANK>.txt``, waits until all ``WORLD_SIZE`` records exist (a minute at most,
then a test finds one missing), and raises the error again so the launcher sees it.
"""

import os
import runpy
import sys
import time
from pathlib import Path

from xlarun import SplitWorldError

RECORD_WAIT_S = 60

out_dir, script, script_args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
sys.argv = [script, *script_args]
try:
    runpy.run_path(script, run_name="__main__")
except SplitWorldError as error:
    record = out_dir / f"{os.environ['RANK']}.txt"
    partial = record.with_suffix(".partial")
    partial.write_text(f"{type(error).__name__}: {error}")
    partial.rename(record)
    deadline = time.monotonic() + RECORD_WAIT_S
    while len(list(out_dir.glob("*.txt"))) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise
