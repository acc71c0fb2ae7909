"""The paths ``--event-log`` and ``--metrics-textfile`` write to, whatever is there: a regular file, a
symbolic link, a FIFO or a device node (``/dev/null``, ``/dev/full``, a terminal).

Usage::

    fd = open_without_waiting(path, os.O_APPEND | os.O_CREAT)  # OSError(ENXIO) for a FIFO with no reader yet
    write_whole(fd, line)                                       # all of it, or OSError with none of it written
    replace_whole(path, text)                                   # the metrics file: a scrape reads old or new

Nothing here waits for a reader that is not there, and nothing replaces what the user pointed a path at
with a file of its own: a link's target is written, a FIFO or a device is written in place.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import stat
import tempfile
import termios

PIPE_BUF = select.PIPE_BUF
"""The most bytes a pipe takes whole or not at all (POSIX; 4096 on Linux)."""

_IN_ACCESS = 0x1
"""inotify's event for a read of the watched file (``<sys/inotify.h>``): the reader took bytes from the pipe."""


def open_without_waiting(path: str, flags: int = 0) -> int:
    """``path`` opened to write (``O_NONBLOCK``, so a FIFO's open and writes never wait).

    Raises :class:`OSError` ``ENXIO`` "a FIFO with no reader" where ``path`` is a FIFO nobody has open to read.
    """
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | flags, 0o644)
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO with no reader") from None
        raise


def write_whole(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` (opened by :func:`open_without_waiting`) all at once, or raise :class:`OSError`
    having left none of it where a reader finds it.

    - A regular file (opened ``O_APPEND``): one write; a part that a filling disk took is cut off again
      (the file truncated to its size before) and ``ENOSPC`` raised.
    - A pipe: the kernel writes up to :data:`PIPE_BUF` bytes whole or refuses them (``EAGAIN``: its reader
      is that far behind). Past that, a write into a pipe with some room stops part-way where the room ends
      (measured: 9,000 bytes into a 64 KiB pipe 5,000 bytes short of full wrote 4,096), so a longer ``data``
      is held until the pipe is empty, the one state in which all of a pipe's room is free, and the pipe is
      first grown to hold it where it is smaller (``F_SETPIPE_SZ``, up to ``/proc/sys/fs/pipe-max-size``).
      The hold waits on the reader's reads (inotify), costing no time while the reader reads nothing, and
      ends with ``EPIPE`` once the pipe has no reader.
    - Anything else (``/dev/null``, ``/dev/full``, a terminal): one write, and what a terminal did not take
      at once once it can.
    """
    status = os.fstat(fd)
    if stat.S_ISREG(status.st_mode):
        if os.write(fd, data) < len(data):
            os.ftruncate(fd, status.st_size)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    elif stat.S_ISFIFO(status.st_mode):
        if len(data) > PIPE_BUF:
            _hold_until_it_fits(fd, len(data))
        os.write(fd, data)
    else:
        rest = data[os.write(fd, data) :]
        while rest:
            select.select([], [fd], [])
            rest = rest[os.write(fd, rest) :]


def _queued(fd: int) -> int:
    """The bytes a pipe holds unread (``FIONREAD``, which either end answers)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def _hold_until_it_fits(fd: int, size: int) -> None:
    """Return once the pipe ``fd`` is empty and holds ``size`` bytes; see :func:`write_whole`."""
    if size > fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ):
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
        except OSError:
            raise OSError(errno.EMSGSIZE, f"a line of {size} bytes is more than the pipe holds") from None
    if not _queued(fd):
        return
    import ctypes  # only for a long line behind unread ones

    libc = ctypes.CDLL(None, use_errno=True)
    reads = libc.inotify_init1(os.O_CLOEXEC)
    if reads < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if libc.inotify_add_watch(reads, f"/proc/self/fd/{fd}".encode(), _IN_ACCESS) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        waiting = select.poll()
        waiting.register(fd, 0)  # POLLERR, always reported, once the pipe has no reader
        waiting.register(reads, select.POLLIN)
        while _queued(fd):  # a read between the watch and this test is an event still to come
            if any(ready == fd for ready, _ in waiting.poll()):
                raise OSError(errno.EPIPE, os.strerror(errno.EPIPE))
            os.read(reads, 65536)
    finally:
        os.close(reads)


def written_in_place(path: str, data: bytes) -> bool:
    """Write ``data`` whole into ``path`` where it is a FIFO or a device node (each call opening it anew, so
    that a FIFO's reader reads one content to its end), and say so; False where ``path`` is a regular file,
    a link to one, or nothing yet: a file the caller replaces."""
    try:
        if stat.S_ISREG(os.stat(path).st_mode):
            return False
    except FileNotFoundError:  # nothing there yet, or a link to nothing: the file is made
        return False
    fd = open_without_waiting(path)
    try:
        write_whole(fd, data)
    finally:
        os.close(fd)
    return True


def replace_whole(path: str, data: bytes) -> None:
    """Make ``data`` what ``path`` holds, so that a reader reads the old content or the new, never part.

    A regular file (or nothing yet) is replaced: ``data`` goes into a temporary file beside it (a name
    node_exporter's textfile collector skips, mode 0644), renamed over it. Through a symbolic link the file
    it names is replaced (made, for a link to nothing) and the link stays; the kernel follows the link, as
    it does for the event log's ``open``, so its rules for links in shared directories hold
    (``fs.protected_symlinks``: a link planted in ``/tmp`` does not lead a launcher run as root to another
    file). A FIFO or a device node is written in place, whole (:func:`write_whole`), each call opening it
    anew, so that a FIFO's reader reads one content to its end.
    """
    if written_in_place(path, data):
        return
    target = path
    if os.path.islink(path):
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")  # the file the kernel's walk reached
        finally:
            os.close(fd)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)  # the flag's check let missing directories be made
    # node_exporter reads only *.prom: the temporary name keeps it from reading a file being written.
    fd, temporary = tempfile.mkstemp(prefix=".xlarun-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from a node_exporter of another user
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
