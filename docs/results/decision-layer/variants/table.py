"""Render a variant table of docs/results.md §11 from the runs in a folder: "How the probability was
chosen" from this one, "One probability for both spacings" from ``spacing/``, "A ceiling for the
predictor" from ``ceiling/`` and "The survival prior, calibrated across jobs" from ``prior/``.

.venv/bin/python docs/results/decision-layer/variants/table.py [FOLDER]
"""

from __future__ import annotations

import json
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


def main() -> None:
    runs_in = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    both = runs_in.resolve() != HERE and any(runs_in.glob("causal*-*.json"))
    traces = ("syn", "causal") if both else ("syn",)  # this folder's causal runs are quoted apart
    columns = [(trace, cps) for trace in traces for cps in (60, 300)]
    names = sorted({p.stem.split("-", 1)[1] for t, c in columns for p in runs_in.glob(f"{t}{c}-*.json")})
    print("| variant | " + " | ".join(f"{t}-{c}: JCT at gross" for t, c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in names:
        runs = (cell(runs_in / f"{t}{c}-{name}.json") for t, c in columns)
        print(f"| `{name}` | {' | '.join(runs)} |")
    if runs_in.resolve() != HERE:
        return
    policy = "aft-oof-s50-l30"  # the verdicts averaged in the policy (POLICY_SMOOTH=1): what ships
    runs = (cell(HERE / f"pol-syn{cps}-{policy}.json") for cps in (60, 300))
    print(f"| `{policy}`, verdicts averaged in the policy | {' | '.join(runs)} |")


if __name__ == "__main__":
    main()
