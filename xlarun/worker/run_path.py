"""What a ``--run-path`` worker's Python runs: ``python -u run_path.py SCRIPT ARGS...``.

The script runs through ``runpy.run_path`` as ``__main__`` in a fresh interpreter, as torchrun runs
it in a multiprocessing child. torchrun's child waits at the end until every local worker has
returned, so no peer has gone while the group's threads still run; a script that ends without
destroying its process group survives that. Here the group is destroyed once the script has ended
well, which the way out then no longer races.

The worker's ``sys.path`` and ``sys.argv`` are those of ``python -u -c <this file's code> SCRIPT
ARGS...``: the current directory first, not this file's (where :mod:`xlarun.worker`'s modules would
shadow the script's own imports), and the script's name and arguments. Nothing of xlarun is
imported: the worker's Python may be another than the launcher's.
"""

import os
import runpy
import sys


def _leave() -> None:
    # Join the process groups' threads while the interpreter still runs: a gloo thread that wants
    # the GIL during finalisation is killed inside C++ and aborts the process (exit code 134).
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _run() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == here:
        sys.path[0] = ""
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as end:
        if not end.code:
            _leave()
        raise
    _leave()


if __name__ == "__main__":
    _run()
