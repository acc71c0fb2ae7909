"""``launch``: xlarun against torchrun on this machine, side by side, as a markdown table.

Both launchers run in one session, interleaved (xlarun, torchrun, xlarun, torchrun, ...),
``--repeat`` times per measure, each on a fresh free port (``--standalone``) with its own
log directory. Measures:

* launch and exit of 2, 8 and 32 no-op workers (``pass``), wall time from spawning the
  launcher to reaping it; the same workers started directly by this script, without any
  launcher, are shown alongside as the floor ("no launcher");
* the shell floor, a row under each launch row: a shell (``sh -c``) starts the same workers,
  one python each, all in parallel, and ``wait``\\ s for them, timed as the launchers are (its
  exit status is the shell's: ``wait`` answers 0). The row shows the shell's time under "no
  launcher" and, under each launcher, how far above it that launcher is, paired run by run:
  each launch figure's distance to what starting the workers costs at all;
* the same distance in interpreter starts, a row under it: each run's distance divided by the time
  of a ``python -c pass`` timed beside it (the same interpreter, the same way), so that the row reads
  alike on a fast and on a slow machine;
* peak memory of the launcher: the launcher process and its helper processes (xlarun's
  orphan guard), workers excluded. Helpers are the launcher's descendants that stay in
  its session (workers start sessions of their own), and the guard, which leaves it but is
  known by its name (``orphan-guard``). Each process's peak (``VmHWM``) is
  sampled until it exits, and the peaks are summed, an upper bound on the tree's
  simultaneous peak. ``ru_maxrss`` from ``wait4`` (the largest single process, workers
  included) is a cross-check;
* crash to exit: one worker writes ``time.time()`` just before ``os._exit(1)`` while four
  peers sleep; the latency runs to the moment ``wait4`` returns the launcher here. A launcher
  that ends without that crash (it failed, or was killed) ends the run with how it ended and
  its stderr;
* tee throughput: two workers write 100-byte lines to stdout under ``--tee 3``; this script
  drains the launcher's stdout from a pipe and divides the payload by the time from the
  first worker starting to write to the end of the launcher's output. It also counts the
  lines that did not arrive whole, alone on their line, behind their ``[default<rank>]:``
  prefix.

Medians (and the min-max range) are reported with the ratio torchrun / xlarun.
"""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xlarun.supervision.guard import GUARD_TITLE

from .common import (
    LAUNCHERS,
    check_exit,
    children_of,
    clean_environment,
    cpu_model,
    memory_total_gib,
    name_of,
    peak_rss_kib,
    progress,
    scratch_directory,
    session_of,
    unexpected_end,
)

CRASH_PEERS = 4
TEE_LINE_BYTES = 100
TEE_LINE_TEMPLATE = "rank {rank} line ".ljust(TEE_LINE_BYTES - 1, "x")
MEMORY_WORKERS = 8
# Long enough for the sampler to see every helper process several times.
MEMORY_WORKER_SLEEP_S = 1.0
SAMPLE_INTERVAL_S = 0.005
SHELL = "/bin/sh"

NOOP_WORKER = "pass\n"

SLEEP_WORKER = """\
import sys, time
time.sleep(float(sys.argv[1]))
"""

CRASH_WORKER = """\
import os, sys, time
directory = sys.argv[1]
rank = int(os.environ["LOCAL_RANK"])
peers = int(os.environ["LOCAL_WORLD_SIZE"]) - 1
if rank:
    open(os.path.join(directory, "ready.%d" % rank), "w").close()
    time.sleep(60)
    sys.exit(0)
while sum(name.startswith("ready.") for name in os.listdir(directory)) < peers:
    time.sleep(0.005)
with open(os.path.join(directory, "crash_time"), "w") as handle:
    handle.write(repr(time.time()))
os._exit(1)
"""

TEE_WORKER = """\
import os, sys, time
directory, lines, template = sys.argv[1], int(sys.argv[2]), sys.argv[3]
block = 1000
line = (template.replace("{rank}", os.environ["LOCAL_RANK"]) + "\\n").encode()
chunk = line * block
out = sys.stdout.buffer
with open(os.path.join(directory, "start.%s" % os.environ["LOCAL_RANK"]), "w") as handle:
    handle.write(repr(time.time()))
for _ in range(lines // block):
    out.write(chunk)
out.write(line * (lines % block))
out.flush()
"""


@dataclass
class Sizes:
    launch_workers: tuple[int, ...]
    tee_lines_per_worker: int


FULL = Sizes(launch_workers=(2, 8, 32), tee_lines_per_worker=200_000)
QUICK = Sizes(launch_workers=(2,), tee_lines_per_worker=20_000)


@dataclass
class Measure:
    """One row of the table: samples per launcher, how to show them, and the goal."""

    title: str
    unit: str
    scale: float
    digits: int
    goal: str = ""
    goal_met: Callable[[float, float], bool] | None = None
    samples: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in LAUNCHERS})
    floor: list[float] = field(default_factory=list)

    def median(self, launcher: str) -> float:
        return statistics.median(self.samples[launcher])

    def show(self, values: list[float]) -> str:
        if not values:
            return "—"
        middle = f"{statistics.median(values) * self.scale:.{self.digits}f}"
        if len(values) == 1:
            return middle
        low, high = min(values) * self.scale, max(values) * self.scale
        return f"{middle} ({low:.{self.digits}f}–{high:.{self.digits}f})"


class Runner:
    """Starts launchers and workers with a clean environment inside one scratch directory."""

    def __init__(self, bin_dir: Path, scratch: Path):
        self.bin_dir = bin_dir
        self.scratch = scratch
        self.env = clean_environment()
        self._serial = 0
        self.scripts = {}
        for name, text in (
            ("noop", NOOP_WORKER),
            ("sleep", SLEEP_WORKER),
            ("crash", CRASH_WORKER),
            ("tee", TEE_WORKER),
        ):
            path = scratch / f"{name}_worker.py"
            path.write_text(text)
            self.scripts[name] = str(path)

    def fresh_dir(self, label: str) -> Path:
        self._serial += 1
        directory = self.scratch / f"{self._serial:04d}-{label}"
        directory.mkdir()
        return directory

    def launcher_argv(
        self, launcher: str, nproc: int, log_dir: Path, script: str, *script_args: str, extra: tuple[str, ...] = ()
    ) -> list[str]:
        return [
            str(self.bin_dir / launcher),
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--log-dir",
            str(log_dir),
            *extra,
            script,
            *script_args,
        ]

    def spawn(self, argv: list[str], stderr_path: Path, stdout_fd: int | None = None) -> int:
        """Start ``argv`` as the leader of a new session; stdin and (by default) stdout are /dev/null."""
        # posix_spawn's file actions are tuples of different shapes, one per kind of action.
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, str(stderr_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        ]
        if stdout_fd is None:
            actions.append((os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0))
        else:
            actions.append((os.POSIX_SPAWN_DUP2, stdout_fd, 1))
        return os.posix_spawn(argv[0], argv, self.env, file_actions=actions, setsid=True)

    def python(self) -> str:
        return str(self.bin_dir / "python")


# --- launch and exit ---------------------------------------------------------------------------


def time_to_exit(runner: Runner, who: str, argv: list[str], run_dir: Path) -> float:
    """Wall time from spawning ``argv`` to reaping it, which must exit 0."""
    start = time.perf_counter()
    pid = runner.spawn(argv, run_dir / "stderr")
    _, status, _ = os.wait4(pid, 0)
    elapsed = time.perf_counter() - start
    check_exit(who, status, True, run_dir / "stderr")
    return elapsed


HANG_WATCH = ("--hang-timeout", "600")
"""xlarun's hang detection, on in the rows that measure what it costs (torchrun has none)."""


def own_flags(launcher: str, watch_hangs: bool) -> tuple[str, ...]:
    return HANG_WATCH if watch_hangs and launcher == "xlarun" else ()


def time_launch(runner: Runner, launcher: str, nproc: int, watch_hangs: bool = False) -> float:
    run_dir = runner.fresh_dir(f"launch-{launcher}-{nproc}")
    argv = runner.launcher_argv(
        launcher, nproc, run_dir / "logs", runner.scripts["noop"], extra=own_flags(launcher, watch_hangs)
    )
    return time_to_exit(runner, launcher, argv, run_dir)


def time_shell_floor(runner: Runner, nproc: int) -> float:
    """The shell floor: ``sh -c`` starting the same no-op workers in parallel and waiting for them."""
    run_dir = runner.fresh_dir(f"shell-{nproc}")
    worker = shlex.join([runner.python(), "-u", runner.scripts["noop"]])
    return time_to_exit(runner, SHELL, [SHELL, "-c", f"{worker} & " * nproc + "wait"], run_dir)


def time_interpreter_start(runner: Runner) -> float:
    """One interpreter start: ``python -c pass``, the unit of :func:`in_interpreter_starts`."""
    run_dir = runner.fresh_dir("interpreter")
    return time_to_exit(runner, "python -c pass", [runner.python(), "-c", "pass"], run_dir)


def time_direct_spawn(runner: Runner, nproc: int) -> float:
    """The floor: the same no-op workers started and reaped by this script, no launcher."""
    run_dir = runner.fresh_dir(f"direct-{nproc}")
    argv = [runner.python(), "-u", runner.scripts["noop"]]
    start = time.perf_counter()
    pids = [runner.spawn(argv, run_dir / f"stderr.{rank}") for rank in range(nproc)]
    statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    elapsed = time.perf_counter() - start
    for rank, status in enumerate(statuses):
        check_exit("a directly started worker", status, True, run_dir / f"stderr.{rank}")
    return elapsed


# --- peak memory -------------------------------------------------------------------------------


def descendants(root: int) -> list[int]:
    found = []
    pending = [root]
    while pending:
        children = children_of(pending.pop())
        found.extend(children)
        pending.extend(children)
    return found


@dataclass
class MemorySample:
    tree_kib: int
    launcher_kib: int
    ru_maxrss_kib: int
    processes: int


def sample_memory(runner: Runner, launcher: str) -> MemorySample:
    run_dir = runner.fresh_dir(f"memory-{launcher}")
    argv = runner.launcher_argv(
        launcher, MEMORY_WORKERS, run_dir / "logs", runner.scripts["sleep"], str(MEMORY_WORKER_SLEEP_S)
    )
    pid = runner.spawn(argv, run_dir / "stderr")
    peaks: dict[int, int] = {}
    workers: set[int] = set()
    guards: set[int] = set()
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        for member in [pid, *descendants(pid)]:
            peak, session = peak_rss_kib(member), session_of(member)
            if peak is None or session is None:
                continue
            peaks[member] = max(peak, peaks.get(member, 0))
            if name_of(member) == GUARD_TITLE.split()[0]:
                guards.add(member)
            elif session != pid:
                # A worker, a worker's child, or the guard before it took its name. A worker
                # sampled between the launcher's fork and its setsid still looked like a helper,
                # so its earlier peaks are dropped below.
                workers.add(member)
        time.sleep(SAMPLE_INTERVAL_S)
    helpers = {member: peak for member, peak in peaks.items() if member in guards or member not in workers}
    check_exit(launcher, status, True, run_dir / "stderr")
    return MemorySample(
        tree_kib=sum(helpers.values()),
        launcher_kib=helpers.get(pid, 0),
        ru_maxrss_kib=usage.ru_maxrss,
        processes=len(helpers),
    )


# --- crash to exit -----------------------------------------------------------------------------


def time_crash_to_exit(runner: Runner, launcher: str, watch_hangs: bool = False) -> float:
    run_dir = runner.fresh_dir(f"crash-{launcher}")
    marks = run_dir / "marks"
    marks.mkdir()
    argv = runner.launcher_argv(
        launcher,
        CRASH_PEERS + 1,
        run_dir / "logs",
        runner.scripts["crash"],
        str(marks),
        extra=own_flags(launcher, watch_hangs),
    )
    pid = runner.spawn(argv, run_dir / "stderr")
    _, status, _ = os.wait4(pid, 0)
    exited_at = time.time()
    check_exit(launcher, status, False, run_dir / "stderr")
    crash_time = marks / "crash_time"
    if not crash_time.exists():
        # The launcher ended for another reason than the crash this measure times.
        raise unexpected_end(launcher, status, "before its rank 0 crashed", run_dir / "stderr")
    return exited_at - float(crash_time.read_text())


# --- tee throughput ----------------------------------------------------------------------------


def tee_line(rank: int) -> bytes:
    """What tee worker ``rank`` writes on each line, newline excluded."""
    return TEE_LINE_TEMPLATE.replace("{rank}", str(rank)).encode()


@dataclass
class TeeSample:
    bytes_per_s: float
    lines_per_s: float
    damaged_lines: int


def time_tee(runner: Runner, launcher: str, lines_per_worker: int) -> TeeSample:
    workers = 2
    run_dir = runner.fresh_dir(f"tee-{launcher}")
    marks = run_dir / "marks"
    marks.mkdir()
    argv = runner.launcher_argv(
        launcher,
        workers,
        run_dir / "logs",
        runner.scripts["tee"],
        str(marks),
        str(lines_per_worker),
        TEE_LINE_TEMPLATE,
        extra=("--tee", "3"),
    )
    read_fd, write_fd = os.pipe()
    try:
        pid = runner.spawn(argv, run_dir / "stderr", stdout_fd=write_fd)
    finally:
        os.close(write_fd)
    chunks = []
    try:
        while True:
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        output_ended_at = time.time()
    finally:
        os.close(read_fd)
    _, status, _ = os.wait4(pid, 0)
    check_exit(launcher, status, True, run_dir / "stderr")
    started_at = min(float(path.read_text()) for path in marks.glob("start.*"))
    elapsed = output_ended_at - started_at
    total_lines = workers * lines_per_worker
    return TeeSample(
        bytes_per_s=total_lines * TEE_LINE_BYTES / elapsed,
        lines_per_s=total_lines / elapsed,
        damaged_lines=damaged_lines(b"".join(chunks), workers, lines_per_worker),
    )


def damaged_lines(console: bytes, workers: int, lines_per_worker: int) -> int:
    """Worker lines that did not reach the console whole, each on its own line with its rank's prefix."""
    counts = Counter(console.split(b"\n"))
    intact = sum(
        min(counts[f"[default{rank}]:".encode() + tee_line(rank)], lines_per_worker) for rank in range(workers)
    )
    return workers * lines_per_worker - intact


# --- machine facts -----------------------------------------------------------------------------


def venv_versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, platform\n"
        "print('python', platform.python_version())\n"
        "for name in ('torch', 'torch_xla', 'xlarun', 'click', 'psutil'):\n"
        "    try:\n"
        "        print(name, m.version(name))\n"
        "    except m.PackageNotFoundError:\n"
        "        print(name, 'not installed')\n"
    )
    output = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in output.splitlines())


def machine_facts(python: str, repeat: int, quick: bool, load_before: tuple[float, ...]) -> list[str]:
    versions = venv_versions(python)
    usable = len(os.sched_getaffinity(0))
    load_after = os.getloadavg()
    return [
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores ({usable} usable), memory {memory_total_gib()}",
        f"- OS: {platform.system()} {platform.release()}",
        f"- Python {versions['python']}; torch {versions['torch']}, torch_xla {versions['torch_xla']}, "
        f"xlarun {versions['xlarun']}, click {versions['click']}, psutil {versions['psutil']}",
        f"- {repeat} interleaved runs per launcher and measure{' (quick sizes)' if quick else ''}; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after",
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
    ]


# --- the run -----------------------------------------------------------------------------------


def at_least_10x(xlarun: float, torchrun: float) -> bool:
    return torchrun / xlarun >= 10


def above_shell_floor(launch: Measure, nproc: int, shell: list[float]) -> Measure:
    """The shell floor's row under ``launch`` (``nproc`` workers): each launcher's time less the shell's, run by run."""
    row = Measure(
        f"shell floor (sh -c), {nproc} no-op workers: launch and exit above it",
        launch.unit,
        launch.scale,
        launch.digits,
        floor=shell,
    )
    for launcher in LAUNCHERS:
        row.samples[launcher] = [took - floor for took, floor in zip(launch.samples[launcher], shell, strict=True)]
    return row


def in_interpreter_starts(above: Measure, nproc: int, starts: list[float]) -> Measure:
    """The shell floor's row ``above`` (``nproc`` workers) counted in interpreter starts, each run's distance
    by the start timed beside it: the launcher's own cost, whatever the machine's speed."""
    row = Measure(
        f"interpreter starts above the shell floor, {nproc} no-op workers "
        f"(python -c pass: {statistics.median(starts) * 1000:.1f} ms)",
        "starts",
        1,
        1,
    )
    for launcher in LAUNCHERS:
        row.samples[launcher] = [took / start for took, start in zip(above.samples[launcher], starts, strict=True)]
    return row


def run_benchmark(runner: Runner, repeat: int, sizes: Sizes) -> list[Measure]:
    measures = []

    # Untimed: fills the page cache and the bytecode caches, as on a machine that launched before.
    for launcher in LAUNCHERS:
        time_launch(runner, launcher, 2)
    time_shell_floor(runner, 2)
    time_interpreter_start(runner)

    for nproc in sizes.launch_workers:
        measure = Measure(f"launch and exit, {nproc} no-op workers", "s", 1, 3, "≥ 10×", at_least_10x)
        shell: list[float] = []
        starts: list[float] = []
        progress(f"bench: {measure.title}")
        for _ in range(repeat):
            for launcher in LAUNCHERS:
                measure.samples[launcher].append(time_launch(runner, launcher, nproc))
            measure.floor.append(time_direct_spawn(runner, nproc))
            shell.append(time_shell_floor(runner, nproc))
            starts.append(time_interpreter_start(runner))
        above = above_shell_floor(measure, nproc, shell)
        measures += [measure, above, in_interpreter_starts(above, nproc, starts)]

    nproc = sizes.launch_workers[0]
    watched = Measure(f"launch and exit, {nproc} no-op workers, xlarun {' '.join(HANG_WATCH)}", "s", 1, 3)
    progress(f"bench: {watched.title}")
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            watched.samples[launcher].append(time_launch(runner, launcher, nproc, watch_hangs=True))
    measures.append(watched)

    tree = Measure("", "MiB", 1 / 1024, 1, "≥ 10×", at_least_10x)
    own = Measure("peak RSS, launcher process alone", "MiB", 1 / 1024, 1)
    largest = Measure("ru_maxrss from wait4 (largest process, workers included)", "MiB", 1 / 1024, 1)
    progress(f"bench: peak memory, {MEMORY_WORKERS} workers")
    helper_counts: dict[str, set[int]] = {launcher: set() for launcher in LAUNCHERS}
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            memory = sample_memory(runner, launcher)
            tree.samples[launcher].append(memory.tree_kib)
            own.samples[launcher].append(memory.launcher_kib)
            largest.samples[launcher].append(memory.ru_maxrss_kib)
            helper_counts[launcher].add(memory.processes)
    counts = ", ".join(f"{launcher} {'/'.join(map(str, sorted(helper_counts[launcher])))}" for launcher in LAUNCHERS)
    tree.title = f"peak RSS, launcher tree without workers ({MEMORY_WORKERS} workers; processes: {counts})"
    measures += [tree, own, largest]

    crash = Measure(
        f"crash to exit, {CRASH_PEERS} sleeping peers",
        "ms",
        1000,
        1,
        "xlarun < 100 ms",
        lambda xlarun, torchrun: xlarun < 0.1,
    )
    progress(f"bench: {crash.title}")
    watched_crash = Measure(
        f"crash to exit, {CRASH_PEERS} sleeping peers, xlarun {' '.join(HANG_WATCH)}", "ms", 1000, 1
    )
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            crash.samples[launcher].append(time_crash_to_exit(runner, launcher))
            watched_crash.samples[launcher].append(time_crash_to_exit(runner, launcher, watch_hangs=True))
    measures += [crash, watched_crash]

    lines = sizes.tee_lines_per_worker
    tee_bytes = Measure(
        f"tee throughput, --tee 3, 2 workers × {lines} lines",
        "MB/s",
        1e-6,
        1,
        "≤ 1 (as fast or faster)",
        lambda xlarun, torchrun: xlarun >= torchrun,
    )
    tee_lines = Measure(f"tee throughput, {TEE_LINE_BYTES}-byte lines", "k lines/s", 1e-3, 1)
    tee_damage = Measure(
        f"tee lines lost, torn or unprefixed (of {2 * lines})",
        "lines",
        1,
        0,
        "xlarun 0",
        lambda xlarun, torchrun: xlarun == 0,
    )
    progress(f"bench: {tee_bytes.title}")
    for _ in range(repeat):
        for launcher in LAUNCHERS:
            tee = time_tee(runner, launcher, lines)
            tee_bytes.samples[launcher].append(tee.bytes_per_s)
            tee_lines.samples[launcher].append(tee.lines_per_s)
            tee_damage.samples[launcher].append(tee.damaged_lines)
    measures += [tee_bytes, tee_lines, tee_damage]
    return measures


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}" if denominator else "—"


def markdown_table(measures: list[Measure]) -> list[str]:
    rows = [
        "| measure | unit | xlarun | torchrun | no launcher | torchrun / xlarun | goal | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for measure in measures:
        xlarun, torchrun = measure.median("xlarun"), measure.median("torchrun")
        met = "" if measure.goal_met is None else "yes" if measure.goal_met(xlarun, torchrun) else "**no**"
        rows.append(
            f"| {measure.title} | {measure.unit} | {measure.show(measure.samples['xlarun'])} "
            f"| {measure.show(measure.samples['torchrun'])} | {measure.show(measure.floor)} "
            f"| {ratio(torchrun, xlarun)} | {measure.goal} | {met} |"
        )
    return rows


def compare_launchers(bin_dir: Path, repeat: int, quick: bool) -> list[str]:
    """The ``launch`` run: xlarun and torchrun side by side, as a report."""
    load_before = os.getloadavg()
    with scratch_directory() as scratch:
        runner = Runner(bin_dir, Path(scratch))
        measures = run_benchmark(runner, repeat, QUICK if quick else FULL)
        facts = machine_facts(runner.python(), repeat, quick, load_before)
    return [
        "## xlarun vs torchrun",
        "",
        *facts,
        "",
        "Medians, with the min–max range in parentheses.",
        "",
        *markdown_table(measures),
    ]
