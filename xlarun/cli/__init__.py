"""The command line: the command (:mod:`~xlarun.cli.command`; its click command, :mod:`~xlarun.cli.click_command`, for ``--help`` and completion), the option table
(:mod:`~xlarun.cli.options`), and the glue that hands the options read to planning
(:func:`xlarun.planning.plan.plan_launch`) and runs or prints the plan (:mod:`~xlarun.cli.launch`).
Nothing below this layer imports it."""
