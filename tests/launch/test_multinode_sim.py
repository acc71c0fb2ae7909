"""``python -m scripts.bench pod-scale``: one small real run of the simulated pod, and its table.

No timing is asserted: the simulation must finish and print a number in every column.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

# The package runs from the repository root, where ``scripts`` is a namespace package.
POD_SCALE = [sys.executable, "-m", "scripts.bench", "pod-scale"]


def test_a_small_simulated_pod_prints_its_table(tmp_path: Path) -> None:
    markdown = tmp_path / "pod.md"
    finished = subprocess.run(
        [*POD_SCALE, "--nodes", "4,8", "--window", "1", "--markdown-out", str(markdown)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert finished.returncode == 0, finished.stderr
    rows = [line for line in finished.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == ["4", "8"], finished.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert all(re.fullmatch(r"-?\d+(\.\d+)?", cell) for cell in cells), row
    assert "Goals: 8 nodes join in under 10 s: " in finished.stdout
    assert markdown.read_text() == finished.stdout
