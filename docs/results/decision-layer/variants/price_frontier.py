"""Render docs/results.md §11's "Spending against the machine-time bar" from the price runs: each
method's completion-time reduction and gross extra machine time at each machine price, the bar at
each price (from ``reactive`` and the limit at that price), as a Markdown table and
``price/frontier.png``. Price 8 is the shipped policy's run of the same trace (docs/results/
decision-layer/<run>/summary.json); the others are ``price/<run>-p<price>.json``
(``<run>-p<price>-<method>.json`` when a method ran apart), each the summary.json of

    OMP_NUM_THREADS=1 .venv/bin/python -m straggler.cli evaluate --format google-2011-usage \
        --trace /tmp/causal60-2031 --threshold online --checkpoint-seconds 300 \
        --methods nurd,reactive,nurd-nc --policies speculate@6 --workers 1 --out DIR

(or ``--format synthetic --jobs 40 --seed 0``). The runs on seeds 2028 and 2029 were made so; the
others ran before ``speculate@P`` was spelled, through a scratch script that set the same
`Speculate.machine_price`, and ``--policies speculate@6`` gives the same run (checked on seed 2032
at 300 s: `nurd` +36.00 % at +10.12 %, copies 1071 / 2737).

.venv/bin/python docs/results/decision-layer/variants/price_frontier.py
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parent
sys.path.insert(0, str(SHIPPED.parent))
from decision_layer_table import nurd_bar  # noqa: E402 (docs/results/, where #27's bar is written)

METHODS = ("nurd", "reactive", "gbtr", "nurd-nc")


def shipped_run(run: str) -> Path:
    """The shipped policy's summary of ``run`` (``causal2031-300`` is ``causal-seed2031-300``)."""
    return SHIPPED / re.sub(r"^causal(20\d\d)", r"causal-seed\1", run) / "summary.json"


def load() -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = defaultdict(dict)
    for path in sorted((HERE / "price").glob("*-p*.json")):
        run, price = re.fullmatch(r"(.+-\d+)-p(\d+)(?:-.+)?", path.stem).groups()  # type: ignore[union-attr]
        summary = json.loads(path.read_text())
        kept = runs[run].setdefault(int(price), summary)
        kept["mitigation"].update(summary["mitigation"])  # one run's methods may come from several files
    for run, by_price in runs.items():
        by_price[8] = json.loads(shipped_run(run).read_text())
    return runs


def policy_row(rows: dict) -> dict:
    """The row of the run's one policy (``speculate``, ``speculate@6``)."""
    (row,) = rows.values()
    return row


def point(summary: dict, method: str) -> tuple[float, float] | None:
    row = summary["mitigation"].get(method)
    if row is None:
        return None
    m = policy_row(row)
    return 100 * m["jct_reduction"], 100 * m["gross_extra_machine_time"]


def bar(summary: dict) -> tuple[float, float] | None:
    """(JCT at least, gross at most), %, for `nurd` at this price, if ``reactive`` ran."""
    if "reactive" not in summary["mitigation"]:
        return None
    reactive = policy_row(summary["mitigation"]["reactive"])
    target, cost_cap = nurd_bar(reactive, policy_row(summary["mitigation_limit"]))
    return 100 * target, 100 * cost_cap


def main() -> None:
    runs = load()
    columns = min(len(runs), 3)
    rows = -(-len(runs) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    for ax, (run, by_price) in zip(axes.flat, runs.items(), strict=False):
        prices = sorted(by_price)
        print(f"\n**{run}**\n")
        print("| method | " + " | ".join(f"price {p}" for p in prices) + " |")
        print("|---|" + "---|" * len(prices))
        for method in METHODS:
            cells = [point(by_price[p], method) for p in prices]
            if not any(cells):
                continue
            shown = (f"{c[0]:+.2f} at {c[1]:+.2f}" if c else "–" for c in cells)
            print(f"| `{method}` | " + " | ".join(shown) + " |")
            done = [(p, c) for p, c in zip(prices, cells, strict=True) if c]
            ax.plot([c[1] for _, c in done], [c[0] for _, c in done], "o-", label=method)
            for p, c in done:
                ax.annotate(str(p), (c[1], c[0]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        bars = [bar(by_price[p]) for p in prices]
        shown = (f">= {b[0]:+.2f} at <= {b[1]:+.2f}" if b else "–" for b in bars)
        print("| bar for `nurd` | " + " | ".join(shown) + " |")
        shipped = bar(by_price[8])
        if shipped is not None:
            ax.axhline(shipped[0], color="grey", lw=0.8, ls="--")
            ax.axvline(shipped[1], color="grey", lw=0.8, ls=":")
        ax.set_title(run)
        ax.set_xlabel("gross extra machine time, %")
        ax.set_ylabel("completion-time reduction, %")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        "Each method at machine prices 4-16 (point labels); "
        "dashed: nurd's bar at price 8, dotted: its machine-time cap"
    )
    fig.tight_layout()
    fig.savefig(HERE / "price" / "frontier.png", dpi=110)
    print(f"\nwrote {HERE / 'price' / 'frontier.png'}")


if __name__ == "__main__":
    main()
