"""The command line: the click command (:mod:`~xlarun.cli.command`), the option table
(:mod:`~xlarun.cli.options`), the rules between flags (:mod:`~xlarun.cli.rules`), what
schedulers say about the job (:mod:`~xlarun.cli.cluster`), and the glue that turns it all
into a launch or a dry run (:mod:`~xlarun.cli.launch`). Nothing below this layer imports it."""
