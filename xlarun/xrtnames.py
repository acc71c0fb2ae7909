"""XRT's names that the launcher and the worker must spell alike (torch_xla 2.0 and older).

The launcher (:mod:`xlarun.runtimes.xrt`) gives each worker its own task and device;
the worker (:mod:`xlarun.worker.xrt`) builds the lists naming every task and device.
Both halves describe one cluster, so they read their names from here. The module
imports nothing, so neither side pays for the other's code.
"""

XRT_TASK_JOB = "localservice"
"""The job every XRT task belongs to, as torch_xla's own launcher names it."""

XRT_DEVICE_KINDS = {"cuda": "GPU", "cpu": "CPU"}
"""XRT's device kind for each xlarun device that runs under XRT.

torch_xla 2.0's own torchrun support covered GPU; XRT on CPU uses the same per-process
variables. These kinds are the ones ``XRT_WORKERS`` and ``XRT_DEVICE_MAP`` describe;
TPU and Neuron use ``XRT_TPU_CONFIG`` instead.
"""
