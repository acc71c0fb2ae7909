"""Runs you can leave and find again: each run's record (:mod:`xlarun.jobs.records`), and what the verbs
(``--jobs``, ``--logs``, ``--attach``, ``--stop``, ``--wait``, ``--status``) do with it
(:mod:`xlarun.jobs.verbs`, :mod:`xlarun.jobs.status`)."""
