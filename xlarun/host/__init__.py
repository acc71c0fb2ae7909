"""What this host has and who uses it: device files (:mod:`~xlarun.host.devices`), processes
(:mod:`~xlarun.host.procfs`), who holds the devices (:mod:`~xlarun.host.holders`) and sockets
(:mod:`~xlarun.host.ports`). Reads only the host: no torch, no launch data."""
