"""The command line: the click command (:mod:`~xlarun.cli.click_command`, for ``--help``, ``--version`` and
completion), the parser (:mod:`~xlarun.cli.command`, which reads a launch's options without click and hands
them to :mod:`xlarun.launching`) and the option table (:mod:`~xlarun.cli.options`). Nothing below this layer
imports it but the option table, which the launching layer reads."""
