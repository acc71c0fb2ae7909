"""Arms a worker's stack dump at interpreter start; see :mod:`xlarun.contract`.

This directory is put first on the worker's ``PYTHONPATH`` by the launcher and holds nothing but
this module, which imports nothing of xlarun: the worker's Python may be another than the launcher's.
"""

import os
import sys

_VARIABLE = "XLARUN_STACKS"
_DESCRIPTOR = 1000
"""The number the dump file is held at, which the launcher checks before each dump (``STACKS_DESCRIPTOR``)."""
_HERE = os.path.dirname(os.path.abspath(__file__))


def _arm() -> None:
    setting = os.environ.pop(_VARIABLE, "")
    number, _, path = setting.partition(":")
    if not number.isdigit() or not path:
        return
    import faulthandler
    import fcntl

    try:
        # Opened now, while the file system is reachable; a dump needs no allocation or open.
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    except OSError:
        return  # no dump file: the signal stays unhandled and the launcher never sends it
    try:
        # The lowest free number from _DESCRIPTOR on: _DESCRIPTOR itself unless something holds it.
        descriptor = fcntl.fcntl(opened, fcntl.F_DUPFD_CLOEXEC, _DESCRIPTOR)
    except OSError:
        return  # over the limit of open files: no number the launcher could check, so no dump
    finally:
        os.close(opened)
    if descriptor != _DESCRIPTOR:
        os.close(descriptor)
        return
    # faulthandler keeps the file object for as long as the registration lasts.
    faulthandler.register(int(number), file=os.fdopen(descriptor, "w"), all_threads=True, chain=False)


def _restore_path() -> None:
    """The worker's ``PYTHONPATH`` and ``sys.path`` as they would be without the hook."""
    value = os.environ.get("PYTHONPATH", "")
    if value == _HERE:
        del os.environ["PYTHONPATH"]
    elif value.startswith(_HERE + os.pathsep):
        os.environ["PYTHONPATH"] = value[len(_HERE) + 1 :]
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]


def _hand_over() -> None:
    """Import the ``sitecustomize`` this one shadows (a distribution's, a virtualenv's), as site would."""
    this = sys.modules.pop(__name__)
    try:
        # The next one on sys.path, now that this directory left it.
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as error:
        # None further on: the import that runs this module still needs it in sys.modules.
        sys.modules[__name__] = this
        if error.name != "sitecustomize":
            raise


if __name__ == "sitecustomize":
    _arm()
    _restore_path()
    _hand_over()
