"""The launching layer: it turns the options read into a run, on one node (:mod:`~xlarun.launching.node`), on
several hosts (:mod:`~xlarun.launching.hosts`), left running (``--detach``, :mod:`~xlarun.launching.detach`),
from ``xlarun.launch()`` (:mod:`~xlarun.launching.library`), or into a ``--stacks`` dump of a running launch
(:mod:`~xlarun.launching.stacks`). Of the command line it reads the option table (:mod:`xlarun.cli.options`)
alone."""
