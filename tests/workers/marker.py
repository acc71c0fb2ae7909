"""A worker that only proves it ran: it creates the file named by its first argument."""

import sys

with open(sys.argv[1], "a") as handle:
    handle.write("ran\n")
