"""From the command line's values to a running (or printed) launch on this node.

The glue between the layers: the options are read from their table, one planning call
(:func:`xlarun.planning.plan.plan_launch`) turns them into the whole plan, and then either a dry
run prints it or a rendezvous is chosen and the agent runs it. A job on several hosts goes on to
:mod:`xlarun.launching.hosts`, a run to leave to :mod:`xlarun.launching.detach`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

from xlarun.cli.options import read_options
from xlarun.config import LaunchConfig, Topology
from xlarun.console import console, say
from xlarun.exceptions import LaunchError, UsageError
from xlarun.flags import flag
from xlarun.host.devices import device_files, host_root
from xlarun.host.ports import free_port, is_local_address, taken_here
from xlarun.host.programs import program_problem
from xlarun.planning.device import DevicePlan
from xlarun.planning.environment import worker_variables
from xlarun.planning.packages import installed_version
from xlarun.planning.plan import LaunchPlan, plan_launch
from xlarun.planning.rules import check_hosts, require_script
from xlarun.ranks import NodeAssignment
from xlarun.rendezvous import FixedRendezvous, Rendezvous, multi_node_rendezvous
from xlarun.runtimes import CompileCache
from xlarun.structs import replace
from xlarun.supervision.agent import EVENTS_FLUSH_S, Agent
from xlarun.supervision.end import RunEnd
from xlarun.supervision.events import NO_EVENTS, EventBus, Sink, trace_id_of

TYPE_CHECKING = False  # typing stays off a launch's path
if TYPE_CHECKING:
    from typing import Any


def launch_from_command_line(
    given: Mapping[str, str | None],
    script: str | None,
    script_args: tuple[str, ...],
    environ: Mapping[str, str],
    *,
    detached: bool = False,
    on_started: Callable[[], None] | None = None,
) -> int:
    """Run the launch the command line describes (or print its plan, or start it in the background with
    ``--detach``); returns the exit code. ``detached``: this is the launcher a ``--detach`` started;
    ``on_started``: what it calls once every host of a job on several hosts is ready."""
    # Workers get the environment as it was when the launcher started, whatever it sets for itself.
    environ = dict(environ)
    values = read_options(given, environ)
    to_detach = values["detach"] and not values["dry_run"]
    if check_hosts(values):
        if to_detach:
            from xlarun.launching.detach import detach

            return detach(values, given, require_script(script), script_args, environ, on_hosts=True)
        from xlarun.launching.hosts import launch_hosts

        return launch_hosts(values, given, script, script_args, environ, on_started=on_started)
    prepared = plan_launch(values, script, script_args, environ)
    if prepared.config.dry_run:
        return print_plan(prepared, environ)
    if to_detach:
        from xlarun.launching.detach import detach

        check_before_start(prepared, environ)
        return detach(values, given, prepared.config.command.script, script_args, environ)
    if detached:
        prepared = replace(prepared, config=replace(prepared.config, console_whole_lines=True))
    return run_launch(prepared, environ).exit_code


def check_before_start(prepared: LaunchPlan, environ: Mapping[str, str]) -> None:
    """What :func:`run_launch` refuses before anything starts (a compile cache that cannot be written, a busy
    device, a taken store port, a missing program), where the launch is to be left running: nothing is started,
    nothing is contacted, and torch is not imported (the rendezvous of several nodes checks its own when the run
    starts)."""
    if prepared.device.compile_cache is not None:
        from xlarun.host.cachedir import prepare_cache_directory

        prepare_cache_directory(prepared.device.compile_cache.root)
    if not prepared.config.allow_busy_device:
        refuse_busy_device(prepared.device.device, environ)
    if prepared.config.topology in (Topology.STANDALONE, Topology.LONE_NODE):
        choose_rendezvous(prepared.config, prepared.device, environ)
    check_command(prepared.config)


def run_launch(prepared: LaunchPlan, environ: Mapping[str, str]) -> RunEnd:
    """Preflight the planned launch, run it, and say how it ended: the command's engine, and
    :func:`xlarun.launch`'s. Refusals before anything starts are raised (:class:`UsageError`,
    :class:`LaunchError`); ``environ`` is what the workers get, under xlarun's own variables."""
    cache = prepared.device.compile_cache
    entries_before = 0
    if cache is not None:  # the cache directory's module loads only for a run that keeps one
        from xlarun.host.cachedir import count_entries, prepare_cache_directory

        entries_before = count_entries(cache.root)
    events = open_events(prepared, environ, entries_before)
    try:
        if cache is not None:
            prepare_cache_directory(cache.root)
        if not prepared.config.allow_busy_device:
            refuse_busy_device(prepared.device.device, environ)
        rendezvous = choose_rendezvous(prepared.config, prepared.device, environ)
        check_command(prepared.config)
    except (LaunchError, UsageError) as error:
        events.emit("preflight.refused", 0, reason=str(error))
        events.emit("launch.finished", 0, **{"process.exit.code": error.exit_code}, result="refused", root_cause=None)
        events.close(EVENTS_FLUSH_S)
        raise
    for notice in prepared.notices:
        say(notice)

    def variables_for(node: NodeAssignment, local_rank: int, error_file: str) -> dict[str, str]:
        return worker_variables(prepared.config, node, local_rank, prepared.device, environ, error_file)

    def end_facts() -> dict[str, Any]:
        if cache is None:
            return {}
        entries = {"entries_before": entries_before, "entries_after": count_entries(cache.root)}
        return {"compile_cache": {"directory": cache.root, **entries}}

    end = Agent(prepared.config, rendezvous, environ, variables_for, events, end_facts).run()
    explain_split_world_failure(end, prepared)
    return end


def event_sinks(prepared: LaunchPlan, environ: Mapping[str, str]) -> list[Sink]:
    """Where the run's events go, none by default: the JSON-lines log, torchrun's console events, the
    metrics file, systemd (under a ``Type=notify`` unit). Each sink's module is loaded only when wanted."""
    sinks: list[Sink] = []
    event_log = prepared.config.event_log
    if event_log:
        from xlarun.supervision.eventlog import JsonLinesSink

        try:
            sinks.append(JsonLinesSink.open(event_log))
        except OSError as error:
            raise UsageError(f"{flag('event_log')} {event_log}: cannot open it: {error.strerror or error}") from None
    if prepared.event_log_handler == "console":
        from xlarun.supervision.torchrun_events import TorchrunConsoleSink, TorchrunIdentity

        sinks.append(TorchrunConsoleSink(TorchrunIdentity.of(prepared.config), console(2).write))
    if prepared.metrics_textfile:
        from xlarun.supervision.metrics import MetricsTextfile

        sinks.append(MetricsTextfile(prepared.metrics_textfile))
    if environ.get("NOTIFY_SOCKET"):
        from xlarun.supervision.systemd import SystemdNotify

        notify = SystemdNotify.from_environ(environ, prepared.config.nproc_per_node)
        if notify is not None:
            sinks.append(notify)
    return sinks


def open_events(prepared: LaunchPlan, environ: Mapping[str, str], cache_entries: int = 0) -> EventBus:
    """The run's event bus, its first event emitted: :data:`NO_EVENTS` (no thread, nothing to pay) without sinks.

    ``cache_entries``: the files in ``--compile-cache``'s directory as the launch starts."""
    sinks = event_sinks(prepared, environ)
    if not sinks:
        return NO_EVENTS
    config = prepared.config
    # The node rank is known before the rendezvous where it is given (static) or there is one node only;
    # c10d across nodes decides it at the rendezvous, which names it to the bus then.
    known = config.rdzv_backend == "static" or config.max_nodes == 1
    bus = EventBus(
        sinks, run_id=config.rdzv_id, node_rank=config.node_rank if known else None, trace_id=trace_id_of(environ)
    )
    bus.emit(
        "launch.started",
        0,
        nnodes=config.max_nodes,
        min_nodes=config.min_nodes,
        nproc_per_node=config.nproc_per_node,
        device=prepared.device.device,
        runtime=prepared.device.runtime,
        **cache_attributes(prepared.device.compile_cache, cache_entries),
    )
    return bus


def cache_attributes(cache: CompileCache | None, entries: int) -> dict[str, Any]:
    """``launch.started``'s ``compile_cache``: the directory and its entries, where one was given."""
    return {} if cache is None else {"compile_cache": {"directory": cache.root, "entries": entries}}


def explain_split_world_failure(end: RunEnd, prepared: LaunchPlan) -> None:
    """After the report of a CPU run that failed on a taken store port, name the split world as the cause.

    On one node no agent serves a store, so under ``xla://`` every CPU process, each rank 0 of
    its own world, tries to serve one at MASTER_PORT, and all but the first fail to bind it. The
    first to fail is often the one that did bind it (its checks of the world fail), so every worker
    of the attempt that failed is looked at: the report's failures and those stopped with an error.
    """
    split = prepared.split_world
    if split is None or end.failure is None:
        return
    said = [failure.traceback for failure in (end.failure, *end.other_failures)] + list(end.stopped_with_errors)
    if any("EADDRINUSE" in text for text in said):
        say(
            f"each CPU process took itself for rank 0 and served the store at MASTER_PORT, so all but one failed "
            f"to bind it: {split}"
        )


def choose_rendezvous(config: LaunchConfig, device: DevicePlan, environ: Mapping[str, str]) -> Rendezvous:
    """How this node meets the others, if any; it learns what the device's plan needs of them (TorchTPU's
    address list: free ports for one node's workers, every node's address across nodes)."""
    topology = config.topology
    worker_ports = device.plans_slice_addresses
    host, port = config.store_address()
    if topology is Topology.STANDALONE:
        # The endpoint's host (localhost under --standalone) serves the workers' store: this one must be it.
        if not is_local_address(host):
            raise UsageError(
                f"{flag('rdzv_endpoint')} {config.rdzv_endpoint} has port 0, a free port picked on the "
                f"host serving the store, but {host} is not an address of this host: name the port"
            )
        return FixedRendezvous(config.rdzv_id, host, free_port(host), worker_ports=worker_ports)
    if topology is Topology.LONE_NODE:
        if taken_here(host, port):
            where = f"{flag('rdzv_endpoint')} HOST:PORT" if config.rdzv_endpoint else f"{flag('master_port')} PORT"
            raise UsageError(
                f"master port {port} on {host} is already in use: pick another with {where}, "
                f"or use {flag('standalone')} for a free one"
            )
        return FixedRendezvous(config.rdzv_id, host, port, worker_ports=worker_ports)
    if installed_version("torch") is None:
        # A single node needs no torch in the launcher; nodes meet through torch.distributed's TCPStore.
        how = "several nodes meet" if config.max_nodes > 1 else f"{flag('rdzv_backend')}=c10d meets"
        raise UsageError(
            f"{how} through torch.distributed, which is not installed in this Python: "
            "pip install 'xlarun[multinode]' (or torch)"
        )
    joined = device.xla.megascale if device.xla is not None else None
    return multi_node_rendezvous(
        config,
        environ,
        node_hosts=device.plans_slice_addresses,
        place=device.slice_worker,
        slices=joined.slices if joined is not None else 1,
    )


def refuse_busy_device(device: str, environ: Mapping[str, str]) -> None:
    """Stop before anything starts when other processes hold the device (an earlier run's workers,
    typically): the runtime would fail later, deep inside, without naming them."""
    files = device_files(device, host_root(environ))
    if not files:
        return  # nothing to hold (a CPU), or no such device here: the scan's module is not loaded
    from xlarun.host.holders import busy_device_refusal, describe_holder, find_holders

    holders = find_holders(files)
    if holders:
        for holder in holders:
            say(describe_holder(holder))
        raise LaunchError(busy_device_refusal(device, holders))


def check_command(config: LaunchConfig) -> None:
    problem = program_problem(config.command, os.getcwd())
    if problem is not None:
        raise UsageError(problem)


def print_plan(prepared: LaunchPlan, environ: Mapping[str, str]) -> int:
    """Print the dry run's plan on stdout, and on stderr the lines a real run would print with what was assumed."""
    import json  # only what reads or writes a record loads json

    from xlarun.planning.dryrun import plan_document  # the dry run's own module: a real run never loads it

    cache = prepared.device.compile_cache
    document = plan_document(
        prepared.config,
        prepared.device,
        environ,
        notices=prepared.notices,
        files={"metrics_textfile": prepared.metrics_textfile, "compile_cache": cache.root if cache else None},
    )
    for line in (*document["notices"], *document["assumed"]):
        say(line)
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
