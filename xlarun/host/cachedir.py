"""``--compile-cache DIR`` on this host: the directory made ready before any worker starts, and its entries counted.

Usage::

    prepare_cache_directory("/mnt/cache")    # created if missing; PlanError where it cannot be created or written
    count_entries("/mnt/cache")               # 12: the files under it, at any depth

A directory the workers could not write would fail deep inside the first compile, in every worker, or (a
torch_xla reader) not at all while nothing is kept; so the launcher creates it and writes a file there
first, and refuses the run in one line where either fails.
"""

from __future__ import annotations

import os
import tempfile

from xlarun.exceptions import PlanError
from xlarun.flags import flag


def prepare_cache_directory(path: str) -> None:
    """Create ``path`` (and its missing parents) and check this user can create files in it."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".xlarun-probe-"):
            pass
    except OSError as error:
        # NamedTemporaryFile on a directory without write access raises PermissionError, a file in the way
        # FileExistsError or NotADirectoryError: each one line, nothing started.
        raise PlanError(
            f"{flag('compile_cache')} {path}: cannot {'write in' if os.path.isdir(path) else 'create'} it: "
            f"{error.strerror or error}"
        ) from None


def count_entries(path: str) -> int:
    """The files under ``path`` at any depth (links not followed); 0 where it is missing or unreadable.

    torch_xla keeps one file per compiled graph; the Neuron compiler a folder of a few files per module.
    """
    return sum(len(files) for _, _, files in os.walk(path))
