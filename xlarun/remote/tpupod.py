"""``--tpu-pod NAME`` (and ``--tpu-zone ZONE``): a TPU pod slice's VMs as the hosts, reached through gcloud.

Usage::

    hosts = pod_hosts("my-pod", "us-central2-b")     # ["10.130.0.2", "10.130.0.3", ...], worker 0 first
    template = pod_rsh_template("my-pod", "us-central2-b")
    # gcloud compute tpus tpu-vm ssh my-pod --zone us-central2-b --worker={index} --quiet --command {command} -- -T

The workers are listed once, before anything starts, with ``gcloud compute tpus tpu-vm describe
NAME --zone ZONE --format=json``: the node's ``networkEndpoints``, one per VM in worker order
(``--worker=N`` of ``tpu-vm ssh`` is the N-th), each with its internal ``ipAddress``. The
addresses name the hosts in the output's prefixes and the summary. Each VM is then reached with
``gcloud compute tpus tpu-vm ssh NAME --worker=N --command CMD``, which brings gcloud's own keys
and project; the words after ``--`` go to ssh, and ``-T`` keeps it from asking for a terminal (a
pty would merge stderr into stdout and add ``\\r`` to every line). ``--quiet`` (a flag of every gcloud
command) answers gcloud's own questions (a first run's "generate an SSH key?") with their defaults:
the agent's standard input carries its plan, and nothing else may read it. Each host reads its node rank
and the slice's shape from its own metadata server (``--cluster tpu-vm``), as a node started by
hand on that VM would.

The listing is a read of the pod's description (no VM is contacted), so the dry run makes it too.
gcloud missing, failing (an unknown pod or zone, no credentials) or describing a pod without
workers is one line and exit 2: the command line names hosts that cannot be had.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
from typing import Any

from xlarun.exceptions import UsageError
from xlarun.flags import flag

GCLOUD = "gcloud"
TPU_VM = (GCLOUD, "compute", "tpus", "tpu-vm")
DESCRIBE_TIMEOUT_S = 120.0
"""How long the listing may take: gcloud answers in seconds, but refreshes its credentials first."""


def zone_words(zone: str | None) -> list[str]:
    """``--zone ZONE``, or nothing: gcloud then uses its configured ``compute/zone``."""
    return ["--zone", zone] if zone else []


def describe_argv(name: str, zone: str | None) -> list[str]:
    """The command that lists the pod's workers."""
    return [*TPU_VM, "describe", name, *zone_words(zone), "--format=json"]


def pod_rsh_template(name: str, zone: str | None) -> str:
    """The ``--rsh`` template that runs a command on worker ``{index}`` of the pod, without a terminal."""
    return shlex.join(
        [*TPU_VM, "ssh", name, *zone_words(zone), "--worker={index}", "--quiet", "--command", "{command}", "--", "-T"]
    )


def pod_hosts(name: str, zone: str | None) -> list[str]:
    """The pod's workers' internal addresses, worker 0 first; a :class:`UsageError` where they cannot be listed."""
    argv = describe_argv(name, zone)
    where = f"{flag('tpu_pod')} {name}"
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=DESCRIBE_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise UsageError(
            f"{where}: gcloud is not installed (not on PATH): install the Google Cloud CLI, "
            f"or name the VMs with {flag('hosts')}"
        ) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{where}: {shlex.join(argv)} did not answer within {DESCRIBE_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        said = last_line(done.stderr) or f"exit {done.returncode}"
        raise UsageError(f"{where}: {shlex.join(argv)} failed: {said}")
    try:
        return endpoint_addresses(json.loads(done.stdout))
    except (ValueError, TypeError) as error:
        raise UsageError(f"{where}: {shlex.join(argv)}: {error}") from None


def endpoint_addresses(node: Any) -> list[str]:
    """The ``ipAddress`` of each of a described node's ``networkEndpoints``, in order; ValueError naming
    what is missing or wrong."""
    if not isinstance(node, dict):
        raise ValueError("the description is not a JSON object")
    endpoints = node.get("networkEndpoints")
    if not endpoints:
        state = node.get("state")
        raise ValueError(f"the pod has no workers (networkEndpoints is empty{f'; state {state}' if state else ''})")
    if not isinstance(endpoints, list):
        raise ValueError("networkEndpoints is not a list")
    addresses = []
    for number, endpoint in enumerate(endpoints):
        address = endpoint.get("ipAddress") if isinstance(endpoint, dict) else None
        try:
            addresses.append(str(ipaddress.ip_address(address)))  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(f"worker {number} has no IP address (ipAddress={str(address)[:60]!r})") from None
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"the workers' addresses repeat ({', '.join(addresses)})")
    return addresses


def last_line(text: str) -> str:
    """The last non-blank line of a program's stderr, where gcloud puts its ``ERROR: ...`` line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
