"""Writes what the launcher gave this worker (environment, argv, command line, cwd) to a JSON file.

``env`` is the environment as the script sees it; ``exec_env`` the one the process was started
with, before xlarun's stack-dump hook gave the script its own back (``PYTHONPATH``, ``XLARUN_STACKS``).

The file is ``$DUMP_DIR/<RANK>_<TORCHELASTIC_RESTART_COUNT>.json``.
"""

import json
import os
import sys

with open("/proc/self/cmdline", "rb") as handle:
    command_line = [part.decode() for part in handle.read().split(b"\0") if part]

with open("/proc/self/environ", "rb") as handle:
    exec_env = dict(entry.decode().partition("=")[::2] for entry in handle.read().split(b"\0") if entry)

record = {
    "env": dict(os.environ),
    "exec_env": exec_env,
    "argv": sys.argv,
    "sys_path": sys.path,
    "command_line": command_line,
    "executable": sys.executable,
    "cwd": os.getcwd(),
}
name = f"{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
with open(os.path.join(os.environ["DUMP_DIR"], name), "w") as handle:
    json.dump(record, handle)
