"""``--tpu-pod NAME`` (and ``--tpu-zone ZONE``): a TPU slice's VMs as the hosts, reached through gcloud.

Usage::

    pod = find_pod("my-pod", "us-central2-b")
    pod.hosts       # ["10.130.0.2", "10.130.0.3", ...], worker 0 first
    pod.template    # gcloud compute tpus tpu-vm ssh my-pod --zone us-central2-b --worker={index} --quiet
                    #     --command {command} -- -T
    # a TPU7x slice, a managed instance group: its instances, each reached by name
    # gcloud compute ssh {host} --zone us-central2-b --quiet --command {command} -- -T

A slice is a Cloud TPU resource (v2 to v6e) or, from TPU7x on, where Google documents the Cloud TPU API
as unsupported, a Compute Engine managed instance group whose instances are the slice's VMs. The
resource is asked for first; where gcloud cannot describe one of that name, the group.

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

A managed instance group is listed with ``gcloud compute instance-groups managed list-instances NAME
--zone ZONE --format=json``: one object per instance, its ``instance`` the instance's URL, whose last
part is its name (``name`` where the URL is missing). The instances, in the order the group lists them,
are the hosts, named as the instances (the VPC's internal DNS resolves them), and each is reached with
``gcloud compute ssh INSTANCE --zone ZONE --quiet --command CMD -- -T``; as on a Cloud TPU's VMs, each
host reads its node rank, node 0 and the slice's shape from its own metadata server.

The listing is a read of the pod's description or the group's list (no VM is contacted), so the dry
run makes it too. gcloud missing, finding neither (an unknown pod or zone, no credentials) or a pod or
group without workers is one line and exit 2: the command line names hosts that cannot be had.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import subprocess
from typing import Any, NamedTuple

from xlarun.exceptions import UsageError
from xlarun.flags import flag

GCLOUD = "gcloud"
TPU_VM = (GCLOUD, "compute", "tpus", "tpu-vm")
MANAGED_GROUP = (GCLOUD, "compute", "instance-groups", "managed")
INSTANCE_NAME = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A Compute Engine instance's name (RFC 1035, at most 63 characters): what may stand as a host and an ssh argument."""
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


def list_instances_argv(name: str, zone: str | None) -> list[str]:
    """The command that lists a managed instance group's instances."""
    return [*MANAGED_GROUP, "list-instances", name, *zone_words(zone), "--format=json"]


def instance_rsh_template(zone: str | None) -> str:
    """The ``--rsh`` template that runs a command on the instance ``{host}``, without a terminal."""
    return shlex.join(
        [GCLOUD, "compute", "ssh", "{host}", *zone_words(zone), "--quiet", "--command", "{command}", "--", "-T"]
    )


class Pod(NamedTuple):
    """A slice's hosts, worker 0 first, and the ``--rsh`` template that reaches each."""

    hosts: list[str]
    template: str


def find_pod(name: str, zone: str | None) -> Pod:
    """The Cloud TPU named ``name``, else the managed instance group; a :class:`UsageError` in one line naming
    what each listing said where neither can be had."""
    where = f"{flag('tpu_pod')} {name}"
    tpu = gcloud_json(describe_argv(name, zone), where)
    if not isinstance(tpu, str):
        try:
            return Pod(endpoint_addresses(tpu), pod_rsh_template(name, zone))
        except (ValueError, TypeError) as error:
            raise UsageError(f"{where}: {shlex.join(describe_argv(name, zone))}: {error}") from None
    group = gcloud_json(list_instances_argv(name, zone), where)
    if isinstance(group, str):
        raise UsageError(f"{where}: {tpu}; nor a managed instance group: {group}")
    try:
        return Pod(instance_names(group), instance_rsh_template(zone))
    except (ValueError, TypeError) as error:
        raise UsageError(f"{where}: {shlex.join(list_instances_argv(name, zone))}: {error}") from None


def pod_hosts(name: str, zone: str | None) -> list[str]:
    """The slice's hosts, worker 0 first (:func:`find_pod`)."""
    return find_pod(name, zone).hosts


def gcloud_json(argv: list[str], where: str) -> Any:
    """What gcloud printed, parsed; or, where it failed, the line saying so (``<argv> failed: <its last line>``).

    gcloud missing, not answering or printing what is not JSON is a :class:`UsageError` at once."""
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
        return f"{shlex.join(argv)} failed: {last_line(done.stderr) or f'exit {done.returncode}'}"
    try:
        return json.loads(done.stdout)
    except ValueError as error:
        raise UsageError(f"{where}: {shlex.join(argv)}: {error}") from None


def instance_names(instances: Any) -> list[str]:
    """The name of each instance a managed instance group lists, in its order; ValueError naming what is
    missing or wrong."""
    if not isinstance(instances, list):
        raise ValueError("the list is not a JSON array")
    if not instances:
        raise ValueError("the group has no instances")
    names = []
    for number, instance in enumerate(instances):
        fields = instance if isinstance(instance, dict) else {}
        url = fields.get("instance")
        name = url.rpartition("/")[2] if isinstance(url, str) else fields.get("name")
        if not isinstance(name, str) or not re.match(INSTANCE_NAME, name):
            raise ValueError(f"instance {number} has no instance name (instance={str(url)[:80]!r})")
        names.append(name)
    if len(set(names)) != len(names):
        raise ValueError(f"the instances repeat ({', '.join(names)})")
    return names


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
