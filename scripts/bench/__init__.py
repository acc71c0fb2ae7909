"""Benchmark xlarun against torchrun on this machine and print a markdown table.

Run from the repository root, where ``scripts`` is a namespace package and xlarun the checkout's::

    .venv/bin/python -m scripts.bench launch [--repeat 5] [--quick] [--markdown-out FILE] [--bin-dir DIR]
    .venv/bin/python -m scripts.bench share TREE [TREE ...] [--repeat 15] [--markdown-out FILE] [--bin-dir DIR]
    .venv/bin/python -m scripts.bench pod-scale [--nodes 8,64,512,2048] [--window 10] [--markdown-out FILE]
    .venv/bin/python -m scripts.bench agent-cpu [--cpu-run 20] [--markdown-out FILE] [--bin-dir DIR]

``--bin-dir`` holds the ``xlarun``, ``torchrun`` and ``python`` under test (``share`` runs each tree with its ``python``) (the repository's
``.venv/bin`` by default). The report goes to stdout, and to ``--markdown-out`` as well; progress
goes to stderr. One module per subcommand, each with its measures and their method:

* :mod:`.launch`: both launchers side by side, interleaved: launch and exit with its floors,
  peak memory, crash to exit, tee throughput;
* :mod:`.share`: xlarun's own share of a launch, this checkout against other source trees
  (a ``git worktree`` of an earlier commit), in interpreter starts above the shell floor;
* :mod:`.pod_scale`: xlarun's multi-node rendezvous for thousands of simulated nodes;
* :mod:`.agent_cpu`: node 0's agent CPU with 2 and 24 real agents on loopback;

and :mod:`.common`, what they share.
"""
