"""Render a variant table of docs/results.md §11 from the runs in a folder: "How the probability was
chosen" from this one, "One probability for both spacings" from ``spacing/``.

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
    names = sorted({p.stem.split("-", 1)[1] for p in runs_in.glob("syn*-*.json")})
    print("| variant | syn-60: JCT at gross | syn-300: JCT at gross |")
    print("|---|---|---|")
    for name in names:
        runs = (cell(runs_in / f"syn{cps}-{name}.json") for cps in (60, 300))
        print(f"| `{name}` | {' | '.join(runs)} |")
    if runs_in.resolve() != HERE:
        return
    policy = "aft-oof-s50-l30"  # the verdicts averaged in the policy (POLICY_SMOOTH=1): what ships
    runs = (cell(HERE / f"pol-syn{cps}-{policy}.json") for cps in (60, 300))
    print(f"| `{policy}`, verdicts averaged in the policy | {' | '.join(runs)} |")


if __name__ == "__main__":
    main()
