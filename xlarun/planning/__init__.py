"""Planning: what each worker gets before anything starts, as pure functions of the flags, the
host and the installed packages. The one call from the options read to the whole plan
(:mod:`~xlarun.planning.plan`), what schedulers say about the job (:mod:`~xlarun.planning.cluster`,
with Slurm's host lists in :mod:`~xlarun.planning.hostlist`), the rules between flags
(:mod:`~xlarun.planning.rules`), installed versions (:mod:`~xlarun.planning.packages`), the device
and runtime (:mod:`~xlarun.planning.device`, over :mod:`xlarun.runtimes`), each worker's variables
(:mod:`~xlarun.planning.environment`) and the dry run (:mod:`~xlarun.planning.dryrun`)."""
