"""Linux's limit on one environment variable, which a value with one entry per host or device can pass.

``execve`` refuses (``E2BIG``, "Argument list too long") an environment holding one ``NAME=value``
string longer than ``MAX_ARG_STRLEN`` (32 pages: 131,072 bytes, its terminating NUL included),
whatever room the rest of the environment leaves. Measured for ``TORCH_TPU_SLICEBUILDER_ADDRESSES``
(32 characters): a value of 131,038 bytes starts a process, 131,039 does not
(``../shared/reference/torchtpu-torchneuron.md`` §6). A plan that would pass it is refused before
any worker starts, in one line that names the size and the cause.
"""

from __future__ import annotations

from xlarun.exceptions import PlanError

MAX_VARIABLE_BYTES = 128 * 1024
"""Linux's limit on one ``NAME=value`` string of an environment (``MAX_ARG_STRLEN``), its NUL included."""


def variable_bytes(name: str, value: str) -> int:
    """What ``NAME=value`` takes in a process's environment, its ``=`` and NUL included."""
    return len(name.encode()) + len(value.encode()) + 2


def check_variable_size(name: str, value: str, what: str) -> None:
    """Refuse ``name=value`` where Linux would refuse to start a process with it; ``what`` says what it lists."""
    size = variable_bytes(name, value)
    if size > MAX_VARIABLE_BYTES:
        raise PlanError(
            f"{name} for {what} would take {size:,} bytes, past Linux's 128 KiB limit on one "
            f"environment variable ({MAX_VARIABLE_BYTES:,} bytes, MAX_ARG_STRLEN), so no worker "
            "could start: split the job"
        )
