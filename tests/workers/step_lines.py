"""Prints the line torch_xla's step log prints (``XLA_EMIT_STEPLOG=1``) between two of its own, on stderr.

Usage: ``step_lines.py``
"""

import sys

print("before the step", file=sys.stderr, flush=True)
sys.stderr.write("torch_xla.torch_xla::sync\n")
sys.stderr.flush()
print("after the step", file=sys.stderr, flush=True)
