"""docs/results.md's and docs/results-dask.md's tables are what `scripts/results_tables.py` renders
from the kept summaries: a hand edit of a figure, or a summary changed without re-rendering the page,
fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("page", ["docs/results.md", "docs/results-dask.md"])
def test_the_results_page_is_what_its_script_renders(page: str) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/results_tables.py", "--check", page],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_changed_figure_is_caught(tmp_path: Path) -> None:
    page = (REPO / "docs/results.md").read_text()
    altered = page.replace("+12.25%", "+13.25%", 1)
    assert altered != page
    copy = tmp_path / "results.md"
    copy.write_text(altered)
    done = subprocess.run(
        [sys.executable, "scripts/results_tables.py", "--check", str(copy)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
