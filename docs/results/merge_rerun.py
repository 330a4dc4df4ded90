"""Replace one method's rows in earlier runs by a re-run of that method alone, and re-render the reports.

Used once, after NURD's evidence rule changed (docs/results.md, "The evidence rule"): the other
methods' code did not change, so their rows stand, and only ``nurd`` was re-run, under the same
protocol, into ``docs/results/nurd-evidence/<run>``. Each merged ``summary.json`` records the re-run's
command under ``reruns``. Run from the repository root:
``.venv/bin/python docs/results/merge_rerun.py nurd``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from straggler.report import write_report

RESULTS = Path(__file__).parent
RUNS = (
    "google-300s-online",
    "google-300s-oracle",
    "google-60s-online",
    "google-60s-oracle",
    "synthetic-online",
    "synthetic-oracle",
)


def merge(run: str, method: str) -> None:
    target, rerun = RESULTS / run, RESULTS / "nurd-evidence" / run
    old = json.loads((target / "summary.json").read_text())
    new = json.loads((rerun / "summary.json").read_text())
    for key in ("jobs", "tasks", "excluded_tasks", "threshold", "quantile", "seed"):
        if old[key] != new[key]:
            raise ValueError(f"{run}: {key} differs ({old[key]} vs {new[key]}): not the same protocol")
    old["methods"][method] = new["methods"][method]
    old["jct"][method] = new["jct"][method]
    report = (target / "report.md").read_text()
    title = report.splitlines()[0].removeprefix("# ")
    command = re.search(r"Command: `([^`]*)`", report)
    rerun_command = re.search(r"Command: `([^`]*)`", (rerun / "report.md").read_text())
    assert command and rerun_command
    original = command.group(1).split("`; ")[0]
    old.setdefault("reruns", {})[method] = rerun_command.group(1)
    write_report(old, target, title=title, command=f"{original}`; {method} re-run: `{rerun_command.group(1)}")


if __name__ == "__main__":
    for name in RUNS:
        merge(name, sys.argv[1] if len(sys.argv) > 1 else "nurd")
        print(f"merged {name}")
