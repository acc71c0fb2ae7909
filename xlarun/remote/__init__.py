"""Every host from one command: the launcher starts one agent per host over ssh (or an ``--rsh``
template), sends each its plan on standard input, and makes the hosts one job."""
