"""A worker whose rank 0 writes a few stderr lines and then raises ``RuntimeError``.

Usage: ``raises.py none|xlarun|torch`` — how its main is wrapped: not at all,
``xlarun.record`` or torch's ``torch.distributed.elastic.multiprocessing.errors.record``.
Other ranks wait to be stopped.
"""

import os
import sys
import time


def main() -> None:
    if os.environ["RANK"] != "0":
        time.sleep(600)
        return
    for number in range(30):
        print(f"progress line {number}", file=sys.stderr)
    deepest_frame_of_worker()


def deepest_frame_of_worker() -> None:
    raise RuntimeError("boom from the worker")


if __name__ == "__main__":
    wrapping = sys.argv[1]
    if wrapping == "xlarun":
        import xlarun

        main = xlarun.record(main)
    elif wrapping == "torch":
        from torch.distributed.elastic.multiprocessing.errors import record

        main = record(main)
    main()
