"""A worker that writes many lines to stdout and stderr, then optionally dies abruptly.

Usage: ``chatter.py LINES [--crash-rank R]``

Line ``i`` of rank ``r`` reads ``r<r> <stream> <i> <filler>``; each line goes out in two
writes, flushed apart, so that a launcher that does not keep whole lines together mixes
them. ``--crash-rank R``: after its lines, rank R writes ``last words of r<R>`` to both
streams, then an unterminated ``dying breath of r<R>`` to stderr, and kills itself with
SIGKILL (no interpreter shutdown flushes anything for it).
"""

import argparse
import os
import signal
import sys

parser = argparse.ArgumentParser()
parser.add_argument("lines", type=int)
parser.add_argument("--crash-rank", type=int)
args = parser.parse_args()
rank = int(os.environ["RANK"])

for number in range(args.lines):
    for name, stream in (("out", sys.stdout), ("err", sys.stderr)):
        text = f"r{rank} {name} {number} " + "x" * (number % 97)
        half = len(text) // 2
        stream.write(text[:half])
        stream.flush()
        stream.write(text[half:] + "\n")
        stream.flush()

if args.crash_rank == rank:
    print(f"last words of r{rank}", flush=True)
    print(f"last words of r{rank}", file=sys.stderr, flush=True)
    os.write(2, f"dying breath of r{rank}".encode())
    os.kill(os.getpid(), signal.SIGKILL)
