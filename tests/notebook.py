"""A real Jupyter kernel for the tests: started, fed cells, interrupted, restarted and shut down
the way a notebook front end does it.

The kernel is ipykernel on this interpreter (``sys.executable -m ipykernel_launcher``), started by
jupyter_client's ``KernelManager`` in a session of its own. jupyter_client 8's local provisioner
sends an interrupt as SIGINT to the kernel's whole process group (``os.killpg``) and a restart's
kill as SIGKILL to that group: a child the kernel started in the same group gets both signals, a
child in a session of its own gets neither. Every process the kernel starts inherits
``RUN_MARKER``, so the tests find what is still alive by that mark in ``/proc/<pid>/environ``,
never by a process name.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
from helpers import clean_env, is_alive

RUN_MARKER = "NOTEBOOK_TEST_RUN"
"""Set in the kernel's environment, so every process it starts carries it."""

KERNEL_NAME = "xlarun-test"
START_TIMEOUT_S = 120
CELL_TIMEOUT_S = 180
KERNEL_PACKAGES = ("ipykernel", "jupyter_client", "nbclient", "nbformat")
"""What a kernel needs here: the test dependency group installs them (pyproject.toml)."""


def _cannot_start(reason: str) -> NoReturn:
    """Skip where the kernel's packages are not installed; under CI, where they must be, fail."""
    if os.environ.get("CI"):
        pytest.fail(f"no Jupyter kernel: {reason}", pytrace=False)
    pytest.skip(f"no Jupyter kernel: {reason}")


def require_kernel_packages() -> None:
    missing = []
    for name in KERNEL_PACKAGES:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        _cannot_start(f"{', '.join(missing)} not installed (the test dependency group)")


def marked(token: str, *, also: str | None = None) -> list[int]:
    """Live processes whose environment carries ``RUN_MARKER=token`` (and, if given, a variable
    named ``also``)."""
    needle = f"{RUN_MARKER}={token}".encode()
    prefix = f"{also}=".encode() if also else None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle not in variables or (prefix and not any(v.startswith(prefix) for v in variables)):
            continue
        if is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@dataclass
class Cell:
    """One cell's execution as the front end sees it: its streams, its error, its result."""

    msg_id: str
    stdout: str = ""
    stderr: str = ""
    error: dict[str, Any] | None = None
    result: str | None = None
    done: bool = False
    outputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def error_text(self) -> str:
        """The traceback as the cell shows it, without terminal colours."""
        lines = self.error["traceback"] if self.error else []
        return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(lines))


class Kernel:
    """A started ipykernel and a blocking client on it."""

    def __init__(self, workdir: Path) -> None:
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager

        self.token = uuid.uuid4().hex
        spec = workdir / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "xlarun tests",
                    "language": "python",
                }
            )
        )
        self.workdir = workdir
        self.manager = KernelManager(
            kernel_name=KERNEL_NAME,
            connection_file=str(workdir / "connection.json"),
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(workdir / "kernels")]),
        )
        self.client: Any = None

    def start(self) -> None:
        # ipykernel forwards what its child processes write to fds 1 and 2 into the cell, except
        # under pytest (PYTEST_CURRENT_TEST set): the kernel runs as in a notebook, without it.
        env = {
            name: value for name, value in clean_env({RUN_MARKER: self.token}).items() if name != "PYTEST_CURRENT_TEST"
        }
        self.manager.start_kernel(env=env, cwd=str(self.workdir))
        self._connect()

    def _connect(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=START_TIMEOUT_S)
        except RuntimeError as error:
            _cannot_start(str(error))

    @property
    def pid(self) -> int:
        return int(self.manager.provisioner.pid)  # type: ignore[union-attr]

    def execute(self, code: str) -> Cell:
        """Start a cell and return at once; :meth:`wait` follows it."""
        return Cell(self.client.execute(code))

    def wait(self, cell: Cell, until: Callable[[Cell], bool] | None = None, timeout: float = CELL_TIMEOUT_S) -> Cell:
        """Read the cell's messages until it is done (or ``until`` holds)."""
        deadline = time.monotonic() + timeout
        while not cell.done and not (until and until(cell)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the cell ran past {timeout} s; output so far:\n{cell.stdout}{cell.stderr}")
            try:
                message = self.client.get_iopub_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if message["parent_header"].get("msg_id") != cell.msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                cell.outputs.append(content)
                if content["name"] == "stdout":
                    cell.stdout += content["text"]
                else:
                    cell.stderr += content["text"]
            elif kind == "error":
                cell.error = content
            elif kind == "execute_result":
                cell.result = content["data"].get("text/plain")
            elif kind == "status" and content["execution_state"] == "idle":
                cell.done = True
        return cell

    def run(self, code: str, timeout: float = CELL_TIMEOUT_S) -> Cell:
        return self.wait(self.execute(code), timeout=timeout)

    def value(self, expression: str, timeout: float = CELL_TIMEOUT_S) -> str:
        """The repr of an expression, as a cell ending in it shows it; a cell's error fails the test."""
        cell = self.run(expression, timeout=timeout)
        assert cell.error is None, cell.error_text
        assert cell.result is not None, f"{expression!r} showed no value"
        return cell.result

    def interrupt(self) -> None:
        """The front end's interrupt: SIGINT to the kernel's process group."""
        self.manager.interrupt_kernel()

    def restart(self) -> None:
        """The front end's restart: the kernel's group SIGKILLed, a new kernel started."""
        self.manager.restart_kernel(now=True)
        self._connect()

    def workers(self) -> list[int]:
        """Live processes the kernel started that a launcher made workers (they carry RANK)."""
        return marked(self.token, also="RANK")

    def strays(self) -> list[int]:
        """Everything the kernel started that is still alive, the kernel itself aside."""
        return [pid for pid in marked(self.token) if pid != self.pid]

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=True)


def run_notebook(kernel: Kernel, sources: Sequence[str], timeout: float = CELL_TIMEOUT_S) -> list[Any]:
    """Execute cells as a notebook on the running kernel (nbclient, as ``jupyter execute`` does)
    and return the notebook's cells with their outputs; a cell's error raises."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    NotebookClient(notebook, km=kernel.manager, timeout=int(timeout)).execute()
    return list(notebook.cells)


@contextmanager
def jupyter_kernel(workdir: Path) -> Iterator[Kernel]:
    """A started kernel; on the way out it is shut down and nothing it started may be left alive."""
    require_kernel_packages()
    kernel = Kernel(workdir)
    try:
        kernel.start()
        yield kernel
    finally:
        kernel.shutdown()
        deadline = time.monotonic() + 10
        while marked(kernel.token) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = marked(kernel.token)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert not left, f"processes the kernel started outlived its shutdown: {left}"
