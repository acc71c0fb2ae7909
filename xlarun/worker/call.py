"""What a worker of :func:`xlarun.launch` runs: ``python -m xlarun.worker.call PAYLOAD``.

``PAYLOAD`` names a file in the launch's private directory holding three pickles: the caller's
``sys.path`` (so a function that travels by reference imports here as it did there), the source
lines of the caller's code without a file (a notebook's cells, for this worker's tracebacks), then
the function and its arguments. The worker calls it and leaves, beside the payload:

- :func:`result_file`: the return value, pickled, once it is whole (written to a temporary
  name, then renamed), or
- :func:`exception_file`: the exception it raised, pickled where it can be, after torchrun's error
  file (``TORCHELASTIC_ERROR_FILE``, :func:`xlarun.contract.write_error_file`) has its message and
  traceback for the failure report; the exception then ends the worker as it would end a script.

A return value that cannot be pickled is such an exception: a :class:`TypeError` whose one line
names the rank and the value's type.

cloudpickle, where installed, pickles the value (it takes what the standard pickle refuses, a
lambda among them); the payload is read with the standard unpickler, which loads what either wrote.
"""

from __future__ import annotations

import linecache
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

RESULT_SUFFIX = ".result"
EXCEPTION_SUFFIX = ".exception"


def result_file(payload: str, rank: int) -> str:
    """Where rank ``rank`` leaves its return value."""
    return f"{payload}.{rank}{RESULT_SUFFIX}"


def exception_file(payload: str, rank: int) -> str:
    """Where rank ``rank`` leaves the exception it raised."""
    return f"{payload}.{rank}{EXCEPTION_SUFFIX}"


def pickler() -> Callable[..., None]:
    """cloudpickle's ``dump`` where it is installed, else the standard one."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dump
    dump: Callable[..., None] = cloudpickle.dump
    return dump


def write_whole(path: str, value: Any) -> None:
    """Pickle ``value`` to ``path`` (mode 0600) so that a reader finds all of it or nothing."""
    partial = f"{path}.partial"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            pickler()(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def call(payload: str, rank: int) -> None:
    with open(payload, "rb") as handle:
        caller_path = pickle.load(handle)
        # The caller's path after this interpreter's own: a function importable there imports here.
        sys.path.extend(entry for entry in caller_path if entry not in sys.path)
        linecache.cache.update(pickle.load(handle))
        function, args = pickle.load(handle)
    value = function(*args)
    try:
        write_whole(result_file(payload, rank), value)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as error:
        raise TypeError(
            f"rank {rank} returned a {type(value).__module__}.{type(value).__qualname__}, "
            f"which cannot be pickled: {error}"
        ) from None


def main() -> None:
    payload, rank = sys.argv[1], int(os.environ["RANK"])
    try:
        call(payload, rank)
    except SystemExit:
        raise  # the function ended the worker on purpose, as a script's sys.exit would
    except BaseException as error:
        import traceback

        from xlarun.contract import write_error_file

        write_error_file(error, traceback.format_exc())
        try:
            write_whole(exception_file(payload, rank), error)
        except Exception:  # noqa: BLE001 - an exception that cannot be pickled still has its error file
            pass
        raise


if __name__ == "__main__":
    main()
