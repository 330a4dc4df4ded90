"""Render a variant table of docs/results.md §11 from the runs in a folder: "How the probability was
chosen" from this one, "One probability for both spacings" from ``spacing/``, "A ceiling for the
predictor" from ``ceiling/`` and "The survival prior, calibrated across jobs" from ``prior/``.
Runs on other seeds (``causal2030-300-<variant>.json``, ``syn-seed1-60-<variant>.json``) get a table of
their own.

.venv/bin/python docs/results/decision-layer/variants/table.py [FOLDER]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cell(path: Path) -> str:
    """JCT reduction at gross extra machine time of the one method the run compared."""
    if not path.exists():
        return "–"
    (method,) = json.loads(path.read_text())["mitigation"].values()
    row = method["speculate"]
    return f"{row['jct_reduction']:+.2%} at {row['gross_extra_machine_time']:+.2%}"


def table(runs_in: Path, columns: list[tuple[str, int]]) -> None:
    """One row per variant run in any of ``columns`` (trace prefix, checkpoint seconds); a column
    without runs is left out."""
    columns = [(t, c) for t, c in columns if any(runs_in.glob(f"{t}{c}-*.json"))]
    names = sorted(
        {p.stem.removeprefix(f"{t}{c}-") for t, c in columns for p in runs_in.glob(f"{t}{c}-*.json")}
    )
    print("| variant | " + " | ".join(f"{t.rstrip('-')}-{c}: JCT at gross" for t, c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in names:
        runs = (cell(runs_in / f"{t}{c}-{name}.json") for t, c in columns)
        print(f"| `{name}` | {' | '.join(runs)} |")


def main() -> None:
    runs_in = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    both = runs_in.resolve() != HERE and any(runs_in.glob("causal*-*.json"))
    traces = ("syn", "causal") if both else ("syn",)  # this folder's causal runs are quoted apart
    table(runs_in, [(trace, cps) for trace in traces for cps in (60, 300)])
    if runs_in.resolve() != HERE:
        # other seeds, <trace>-<seconds>-<variant>.json (causal2030-300-..., syn-seed1-60-...): a table
        seeds = sorted(
            {
                m[1]
                for p in runs_in.glob("*.json")
                if (m := re.match(r"(causal20\d\d|syn-seed\d+)-\d+-", p.name))
            }
        )
        if seeds:
            print()
            table(runs_in, [(f"{seed}-", cps) for seed in seeds for cps in (60, 300)])
        return
    policy = "aft-oof-s50-l30"  # the verdicts averaged in the policy (POLICY_SMOOTH=1): what ships
    runs = (cell(HERE / f"pol-syn{cps}-{policy}.json") for cps in (60, 300))
    print(f"| `{policy}`, verdicts averaged in the policy | {' | '.join(runs)} |")


if __name__ == "__main__":
    main()
