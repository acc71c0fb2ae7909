"""Reading ``/proc/<pid>/stat``, whose second field (the name) may hold spaces and parentheses."""

from __future__ import annotations


def stat_fields(path: str) -> tuple[str, list[bytes]]:
    """The process's name and the fields of the stat file at ``path``, numbered as stat(5)
    numbers them: ``fields[3]`` is the state, ``fields[5]`` the process group, and so on
    (``fields[0]`` is empty). Raises ``OSError`` when the process is gone."""
    with open(path, "rb") as handle:
        head, rest = handle.read().rsplit(b")", 1)
    pid, name = head.split(b" (", 1)
    return name.decode(errors="replace"), [b"", pid, name, *rest.split()]
