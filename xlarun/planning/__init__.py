"""Planning: what each worker gets before anything starts, as pure functions of the flags, the
host and the installed packages. Installed versions (:mod:`~xlarun.planning.packages`), the
device and runtime (:mod:`~xlarun.planning.device`, over :mod:`xlarun.runtimes`), each worker's
variables (:mod:`~xlarun.planning.environment`) and the dry run (:mod:`~xlarun.planning.dryrun`)."""
