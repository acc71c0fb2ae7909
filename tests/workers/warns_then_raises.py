"""A worker whose rank 0 warns, then fails deep in its stack with a chained exception, without ``@record``.

Usage: ``warns_then_raises.py [DEPTH]``

Rank 0 writes a ``UserWarning`` (two stderr lines, the second ``  warnings.warn(...)``), then,
``DEPTH`` (default 12) calls down, catches a ``KeyError`` and raises ``RuntimeError`` while
handling it: a traceback of two chained parts, longer than 20 lines. Other ranks wait to be stopped.
"""

import os
import sys
import time
import warnings


def descend(depth: int) -> None:
    if depth:
        descend(depth - 1)
        return
    steps: dict[str, int] = {}
    try:
        steps["missing key"]
    except KeyError:
        # Raised bare, not "from": Python chains it with "During handling of the above exception".
        raise RuntimeError("boom while handling the missing key")  # noqa: B904


def main() -> None:
    if os.environ["RANK"] != "0":
        time.sleep(600)
        return
    warnings.warn("a warning before the failure", stacklevel=1)
    descend(int(sys.argv[1]) if len(sys.argv) > 1 else 12)


if __name__ == "__main__":
    main()
