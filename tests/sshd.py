"""A private OpenSSH server on loopback for the multi-host tests: three "hosts" on one machine.

``ssh_hosts()`` is a context manager that starts Debian's ``sshd`` (installed where missing by
``scripts/install-test-programs.sh``) with its own configuration, host key and authorized key, all
in a fresh temporary directory, listening on 127.0.0.2, 127.0.0.3 and 127.0.0.4 (all of
127.0.0.0/8 is loopback) on a port found free at start, never 22. It gives an :class:`SshHosts`:
the ssh client configuration to pass as ``ssh -F`` (or ``xlarun --ssh-config``), whose aliases
``h1``, ``h2`` and ``h3`` reach the three addresses as root with that key, host keys checked.
On exit it stops the daemon and every session process it started, found as the daemon's
descendants (never by name: another sshd on the machine is not this one's business).

The server sets nothing from the client's environment (no ``AcceptEnv``), so whatever a job's
workers get comes through xlarun's own plan. Every connection comes from 127.0.0.1 whatever
address was dialled: a host is told apart by the destination, which is how
:meth:`SshHosts.sessions_to` and ``ss -K dst`` pick one.

Where this machine cannot run the server (not root: sshd needs root to switch to the user; the
package not installed) the calling test is skipped with the reason, except under CI (the ``CI``
variable set and not empty), where it fails: CI machines are meant to run it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

SSHD = Path("/usr/sbin/sshd")
HOSTS = {"h1": "127.0.0.2", "h2": "127.0.0.3", "h3": "127.0.0.4"}
"""The ssh client configuration's aliases and the loopback address each one reaches."""
# sshd refuses to start without its privilege separation directory, root-owned (Debian's init
# script creates it at boot, which a container never runs).
PRIVSEP_DIR = Path("/run/sshd")
IDENTITY = "id_ed25519"
"""The authorized key's private half, in the fixture's directory."""
# sshd answers within a second once it listens; this only stops a hang.
START_TIMEOUT_S = 20
STOP_TIMEOUT_S = 10
# A port taken between the probe and sshd's bind is tried again with another one.
BIND_ATTEMPTS = 5


@dataclass(frozen=True)
class SshHosts:
    """A running private sshd and the client configuration that reaches it."""

    config: Path
    """The ssh client configuration (``ssh -F``) with the aliases of :data:`HOSTS`."""
    port: int
    directory: Path
    """The temporary directory with the keys, both configurations and the daemon's log."""
    daemon: psutil.Process

    @property
    def log(self) -> Path:
        """The daemon's own log (``sshd -e``), for a failing test to show."""
        return self.directory / "sshd.log"

    def config_with_identity(self, path: Path, identity: Path, aliases: Collection[str]) -> Path:
        """Write at ``path`` a client configuration like :attr:`config` whose ``aliases`` offer
        ``identity`` instead of the authorized key, and return ``path``."""
        identities = {alias: identity if alias in aliases else self.directory / IDENTITY for alias in HOSTS}
        path.write_text(_client_config(self.port, identities, self.directory / "known_hosts"))
        return path

    def sessions_to(self, alias: str) -> list[psutil.Process]:
        """The daemon's per-connection processes serving connections to ``alias``'s address: the
        parents of the processes whose ``SSH_CONNECTION`` names that address and this port as
        the server's end (what a server-side drop kills)."""
        server_end = f" {HOSTS[alias]} {self.port}"
        sessions: dict[int, psutil.Process] = {}
        for process in self.daemon.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.environ().get("SSH_CONNECTION", "").endswith(server_end):
                    parent = process.parent()
                    if parent is not None and parent.pid != self.daemon.pid and _is_daemon_process(parent, self):
                        sessions[parent.pid] = parent
        return list(sessions.values())


@contextlib.contextmanager
def ssh_hosts() -> Iterator[SshHosts]:
    """Start the private sshd, give its :class:`SshHosts`, and stop it and its sessions afterwards."""
    if os.geteuid() != 0:
        _cannot_host("the private sshd needs root (it switches to the user it logs in)")
    missing = [program for program in (str(SSHD), "ssh", "ssh-keygen", "ss") if shutil.which(program) is None]
    if missing:
        _cannot_host(f"{', '.join(missing)} not installed (scripts/install-test-programs.sh installs them)")
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xlarun-sshd-") as name:
        directory = Path(name)
        hosts = _start(directory)
        try:
            yield hosts
        finally:
            _stop(hosts)


def _start(directory: Path) -> SshHosts:
    host_key = _keygen(directory / "host_key")
    identity = _keygen(directory / IDENTITY)
    (directory / "authorized_keys").write_text(Path(f"{identity}.pub").read_text())
    for _ in range(BIND_ATTEMPTS):
        port = _port_free_on_every_host()
        server_config = directory / "sshd_config"
        server_config.write_text(_server_config(directory, port, host_key))
        known_hosts = directory / "known_hosts"
        addresses = ",".join(f"[{address}]:{port}" for address in HOSTS.values())
        known_hosts.write_text(f"{addresses} {Path(f'{host_key}.pub').read_text()}")
        config = directory / "ssh_config"
        config.write_text(_client_config(port, dict.fromkeys(HOSTS, identity), known_hosts))
        with open(directory / "sshd.log", "w") as log:
            daemon = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(server_config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        hosts = SshHosts(config, port, directory, psutil.Process(daemon.pid))
        if _listening(daemon, port):
            _check_login(hosts)
            return hosts
        daemon.wait()
        if "Address already in use" not in hosts.log.read_text():
            _failed(f"sshd exited {daemon.returncode}:\n{hosts.log.read_text()}")
    _failed(f"no free port for sshd after {BIND_ATTEMPTS} attempts")


def _server_config(directory: Path, port: int, host_key: Path) -> str:
    listen = "".join(f"ListenAddress {address}:{port}\n" for address in HOSTS.values())
    # StrictModes would refuse keys under a world-writable /tmp. No AcceptEnv: the client's
    # environment does not travel. MaxStartups above the default 10: a test starts up to six
    # connections at once (two jobs on three hosts), and a refused burst is not what it tests.
    return (
        f"{listen}"
        f"HostKey {host_key}\n"
        f"PidFile {directory / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "MaxStartups 100\n"
        "MaxSessions 100\n"
        "LogLevel VERBOSE\n"
    )


def _client_config(port: int, identities: Mapping[str, Path], known_hosts: Path) -> str:
    return "".join(
        f"Host {alias}\n"
        f"    HostName {address}\n"
        f"    Port {port}\n"
        "    User root\n"
        f"    IdentityFile {identities[alias]}\n"
        "    IdentitiesOnly yes\n"
        "    IdentityAgent none\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
        "    LogLevel ERROR\n"
        for alias, address in HOSTS.items()
    )


def _keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "xlarun-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path


def _port_free_on_every_host() -> int:
    while True:
        with socket.socket() as probe:
            probe.bind((HOSTS["h1"], 0))
            port: int = probe.getsockname()[1]
        if all(_free(address, port) for address in HOSTS.values()):
            return port


def _free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((address, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def _listening(daemon: subprocess.Popen, port: int) -> bool:
    """Wait until every address answers with sshd's banner; False if the daemon exited first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    pending = list(HOSTS.values())
    while pending:
        if daemon.poll() is not None:
            return False
        if time.monotonic() > deadline:
            daemon.kill()
            _failed(f"sshd not answering on {', '.join(pending)} port {port} after {START_TIMEOUT_S} s")
        with contextlib.suppress(OSError), socket.create_connection((pending[0], port), timeout=1) as connection:
            if connection.recv(8).startswith(b"SSH-"):
                pending.pop(0)
                continue
        time.sleep(0.05)
    return True


def _check_login(hosts: SshHosts) -> None:
    for alias in HOSTS:
        login = subprocess.run(
            ["ssh", "-F", str(hosts.config), alias, "true"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=START_TIMEOUT_S,
        )
        if login.returncode != 0:
            _stop(hosts)
            _failed(
                f"ssh -F {hosts.config} {alias} true exited {login.returncode}: {login.stderr.strip()}\n"
                f"sshd's log:\n{hosts.log.read_text()}"
            )


def _stop(hosts: SshHosts) -> None:
    """End the daemon (it stops listening) and then every process it started that is still there."""
    sessions = hosts.daemon.children(recursive=True)
    with contextlib.suppress(psutil.NoSuchProcess):
        hosts.daemon.send_signal(signal.SIGTERM)
    for process in sessions:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    _, alive = psutil.wait_procs([hosts.daemon, *sessions], timeout=STOP_TIMEOUT_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def _is_daemon_process(process: psutil.Process, hosts: SshHosts) -> bool:
    """Whether ``process`` runs sshd's own program (a session), not a shell or program it started."""
    return process.exe() == str(SSHD) and hosts.daemon in process.parents()


def _cannot_host(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        _failed(reason)
    pytest.skip(reason)


def _failed(reason: str) -> NoReturn:
    pytest.fail(f"the private sshd did not start: {reason}", pytrace=False)
