"""Writes what the launcher gave this worker (environment, argv, command line, cwd) to a JSON file.

The file is ``$DUMP_DIR/<RANK>_<TORCHELASTIC_RESTART_COUNT>.json``.
"""

import json
import os
import sys

with open("/proc/self/cmdline", "rb") as handle:
    command_line = [part.decode() for part in handle.read().split(b"\0") if part]

record = {
    "env": dict(os.environ),
    "argv": sys.argv,
    "command_line": command_line,
    "executable": sys.executable,
    "cwd": os.getcwd(),
}
name = f"{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
with open(os.path.join(os.environ["DUMP_DIR"], name), "w") as handle:
    json.dump(record, handle)
