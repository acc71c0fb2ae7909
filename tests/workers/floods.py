"""A worker that writes a flood to stdout, then exits with a code of its own.

Usage: ``floods.py MIB EXIT_CODE``: MIB mebibytes of lines, each written and flushed at once.
"""

import sys

mebibytes, code = int(sys.argv[1]), int(sys.argv[2])
line = "x" * 1023 + "\n"
for _ in range(mebibytes * 1024):
    sys.stdout.write(line)
    sys.stdout.flush()
sys.exit(code)
