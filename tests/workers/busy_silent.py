"""Computes for SECONDS seconds without a line of output, as an XLA compile does, then exits 0.

Usage: ``busy_silent.py SECONDS``
"""

import sys
import time

deadline = time.monotonic() + float(sys.argv[1])
total = 0
while time.monotonic() < deadline:
    total += sum(range(10_000))
