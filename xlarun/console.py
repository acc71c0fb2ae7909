"""The launcher's own lines on stderr: ``xlarun: ...`` lines, and a status line that rewrites
itself on a terminal while an agent waits."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """One line from the launcher on stderr."""
    sys.stderr.write(f"xlarun: {message}\n")
    sys.stderr.flush()


class StatusLine:
    """One line on a terminal that rewrites itself while the agent waits; silent otherwise."""

    def __init__(self) -> None:
        self._shown = False
        self.tty = sys.stderr.isatty()

    def update(self, text: str) -> None:
        if self.tty:
            sys.stderr.write(f"\rxlarun: {text}\033[K")
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._shown = False

    def say(self, message: str) -> None:
        """One line that stays, in place of the status line."""
        self.clear()
        say(message)
