"""Supervision: running the planned workers. The agent's attempts and restarts
(:mod:`~xlarun.supervision.agent`), the event loop over one group of workers
(:mod:`~xlarun.supervision.group`) with their processes, signals, log plan and stream relay,
the orphan guard, and the failure report. It loads neither the option table nor a device
runtime: the agent is handed each worker's variables."""
