"""Render every table of docs/results.md from the summaries kept under docs/results/ (no number typed).

    .venv/bin/python scripts/results_tables.py            # all tables, in the page's order
    .venv/bin/python scripts/results_tables.py --list     # the tables' names
    .venv/bin/python scripts/results_tables.py shipped    # one table
    .venv/bin/python scripts/results_tables.py --update docs/results.md   # re-render the page's tables

Each table reads only the files its docstring names; the commands that wrote them are in
docs/results.md, "How it was measured". In the page, each table follows a line
``<!-- scripts/results_tables.py NAME -->`` and ends at the first blank line: ``--update`` replaces it
with the rendering, ``--check`` exits 1 when one differs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from straggler.report import completion_verdict, equal_cost_rows

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
TRACES = {"syn": "synthetic", "causal": "blind, seed 2027", "google": "real, Google 2011"}
SHIPPED = tuple(f"{trace}-{cps}" for trace in TRACES for cps in (60, 300))
"""The shipped configuration on each trace and checkpoint spacing: docs/results/shipped/<run>/."""
PREDICTORS = ("nurd", "reactive", "gbtr", "nurd-nc")
SEEDS = tuple(
    f"{source}-{cps}"
    for source in ("syn-seed1", "syn-seed2", *(f"causal-seed{s}" for s in (2028, 2029, 2030, 2031, 2032)))
    for cps in (60, 300)
)
"""The same generators at other seeds: docs/results/seeds/<run>/."""
BASELINE_RUNS = {
    "synthetic, 60 s": (
        "protocol/synthetic-online",
        "start/synthetic-online",
        "admm/synthetic-online",
        "nurd-warm/synthetic-online",
    ),
    "real, 60 s": ("protocol/google-60s-online", "nurd-warm/google-60s-online"),
    "real, 300 s": ("protocol/google-300s-online", "start/google-300s-online", "admm/google-300s-online"),
}
"""Where each other predictor's quality comes from, by column."""
FRONTIER = {
    "real, 60 s": "frontier-60s.json",
    "real, 300 s": "frontier-300s.json",
    "synthetic, 60 s": "frontier-synthetic.json",
}
FRONTIER_RULES = (
    "limit",
    *(f"{who} at {x} x p90" for x in ("0.25", "0.5", "0.75", "1") for who in ("stragglers", "all")),
    "spark (75 %, 1.5 x median)",
    "copy every flag",
)


def load(relative: str) -> dict[str, Any]:
    return json.loads((RESULTS / relative / "summary.json").read_text())


def pct(value: float) -> str:
    return f"{value:+.2%}"


def run_name(run: str) -> str:
    trace, cps = run.rsplit("-", 1)
    return f"{TRACES[trace]}, {cps} s"


def shipped() -> Iterator[str]:
    """Completion time and machine time of the shipped policy (`speculate`) with each predictor, beside
    Spark's rule, the policy fed the truth, and the limit (docs/results/shipped/*/summary.json)."""
    yield (
        "| trace | predictor / rule | JCT reduction | extra machine time, gross | net "
        "| share of the limit | jobs made longer | jobs longer than with `reactive` |"
    )
    yield "|---|---|---|---|---|---|---|---|"
    for run in SHIPPED:
        summary = load(f"shipped/{run}")
        limit = summary["mitigation_limit"]["speculate"]
        named = [
            (f"`{m}`", summary["mitigation"][m]["speculate"])
            for m in PREDICTORS
            if m in summary["mitigation"]
        ]
        if "spark-legacy" in summary["mitigation"]["reactive"]:
            named.append(("Spark's rule (`spark-legacy`)", summary["mitigation"]["reactive"]["spark-legacy"]))
        named.append(("*truth-fed policy*", summary["mitigation_oracle"]["speculate"]))
        named.append(("*limit*", limit))
        for i, (name, row) in enumerate(named):
            share = row["jct_reduction"] / limit["jct_reduction"]
            trace = f"{run_name(run)} ({summary['jobs']} jobs)" if i == 0 else ""
            below = row.get("jobs_below_reactive") if name.startswith("`") and name != "`reactive`" else None
            yield (
                f"| {trace} | {name} | {pct(row['jct_reduction'])} | {pct(row['gross_extra_machine_time'])} "
                f"| {pct(row['net_extra_machine_time'])} | {share:.2f} | {row['jobs_longer']} "
                f"| {'–' if below is None else below} |"
            )


def headline() -> Iterator[str]:
    """The page's opening: completion-time reduction at gross extra machine time of the shipped
    configuration (`nurd`, `speculate`), Spark's rule and the limit, at 60 s checkpoints
    (docs/results/shipped/*-60/summary.json)."""
    yield "| trace, 60 s checkpoints | `nurd` + `speculate` (shipped) | Spark's rule | limit |"
    yield "|---|---|---|---|"
    for run in (r for r in SHIPPED if r.endswith("-60")):
        summary = load(f"shipped/{run}")
        rows = (
            summary["mitigation"]["nurd"]["speculate"],
            summary["mitigation"]["reactive"].get("spark-legacy"),
            summary["mitigation_limit"]["speculate"],
        )
        cells = [
            f"{pct(r['jct_reduction'])} at {pct(r['gross_extra_machine_time'])}" if r else "–" for r in rows
        ]
        yield f"| {TRACES[run.rsplit('-', 1)[0]]} ({summary['jobs']} jobs) | " + " | ".join(cells) + " |"


def sample() -> Iterator[str]:
    """The evaluator on the bundled sample of the real trace, the demo's jobs and configuration
    (docs/results/shipped/sample-60/summary.json)."""
    summary = load("shipped/sample-60")
    limit = summary["mitigation_limit"]["speculate"]
    named = [
        ("`nurd` + `speculate` (shipped)", summary["mitigation"]["nurd"]["speculate"]),
        ("Spark's rule (`spark-legacy`)", summary["mitigation"]["nurd"]["spark-legacy"]),
        ("*limit*", limit),
    ]
    yield (
        "| sample, 60 s | JCT reduction | gross extra | net extra | copies won / lost "
        "| share of the limit | jobs made longer |"
    )
    yield "|---|---|---|---|---|---|---|"
    for name, row in named:
        yield (
            f"| {name} | {pct(row['jct_reduction'])} | {pct(row['gross_extra_machine_time'])} "
            f"| {pct(row['net_extra_machine_time'])} | {row['copies_won']:,} / {row['copies_lost']:,} "
            f"| {row['jct_reduction'] / limit['jct_reduction']:.2f} | {row['jobs_longer']} |"
        )


def quality() -> Iterator[str]:
    """How well each shipped predictor names stragglers, task by task (online threshold; a task counts as
    flagged once it was ever flagged): docs/results/shipped/*/summary.json."""
    yield "| trace | predictor | F1 | TPR | FPR | lead time |"
    yield "|---|---|---|---|---|---|"
    for run in SHIPPED:
        methods = load(f"shipped/{run}")["methods"]
        for i, name in enumerate(m for m in PREDICTORS if m in methods):
            m = methods[name]
            yield (
                f"| {run_name(run) if i == 0 else ''} | `{name}` | {m['f1']:.3f} | {m['tpr']:.3f} "
                f"| {m['fpr']:.3f} | {m['lead_time']:.3f} |"
            )


def seeds() -> Iterator[str]:
    """The shipped configuration on the same generators at other seeds: completion-time reduction at gross
    extra machine time, and the jobs any of them made longer (docs/results/seeds/*/summary.json)."""
    yield "| run | `nurd` | `reactive` | `gbtr` | `nurd-nc` | truth-fed policy | limit | jobs made longer |"
    yield "|---|---|---|---|---|---|---|---|"
    for run in SEEDS:
        summary = load(f"seeds/{run}")
        rows = [summary["mitigation"][m]["speculate"] for m in PREDICTORS]
        rows += [summary["mitigation_oracle"]["speculate"], summary["mitigation_limit"]["speculate"]]
        cells = [f"{pct(r['jct_reduction'])} at {pct(r['gross_extra_machine_time'])}" for r in rows]
        longer = sum(r["jobs_longer"] for r in rows)
        yield f"| {run} | " + " | ".join(cells) + f" | {longer} |"


def others() -> Iterator[str]:
    """The other predictors' quality, F1 (lead time), on the synthetic set at 60 s and the real trace
    (docs/results/{protocol,start,admm,nurd-warm}/*/summary.json; the four shipped predictors' rows there
    are left out: the quality table has them, and their `nurd` is an earlier one)."""
    columns = list(BASELINE_RUNS)
    found: dict[str, dict[str, dict[str, float]]] = {}
    for column, runs in BASELINE_RUNS.items():
        for relative in runs:
            for name, m in load(relative)["methods"].items():
                if name not in PREDICTORS:
                    found.setdefault(name, {}).setdefault(column, m)
    yield "| predictor | " + " | ".join(f"{c}: F1 (lead)" for c in columns) + " |"
    yield "|---|" + "---|" * len(columns)
    for name, by_column in found.items():
        cells = [
            f"{by_column[c]['f1']:.3f} ({by_column[c]['lead_time']:.3f})" if c in by_column else "–"
            for c in columns
        ]
        yield f"| `{name}` | " + " | ".join(cells) + " |"


def frontier() -> Iterator[str]:
    """Reference rules on the same jobs and draws: perfect knowledge of which tasks straggle, acted on
    at a given elapsed time, against rules that see only elapsed time
    (docs/results/mitigation/frontier-*.json, written by docs/results/mitigation/frontier.py)."""
    tables = {
        column: json.loads((RESULTS / "mitigation" / name).read_text())["rules"]
        for column, name in FRONTIER.items()
    }
    yield "| rule | " + " | ".join(f"{c}: JCT (extra) share" for c in FRONTIER) + " |"
    yield "|---|" + "---|" * len(FRONTIER)
    for rule in FRONTIER_RULES:
        cells = []
        for column in FRONTIER:
            r = tables[column][rule]
            cells.append(
                f"{pct(r['jct_reduction'])} ({pct(r['extra_machine_time'])}) {r['share_of_limit']:.2f}"
            )
        yield f"| {rule} | " + " | ".join(cells) + " |"


EQUAL_COST = (
    "google-60-report",
    "google-300-report",
    "google-60-report-every-job",
    "google-300-report-every-job",
)
"""The frontier runs on the real trace's reporting half, of its 60 largest jobs and of every job:
docs/results/equal-cost/<run>/."""


def equal_cost() -> Iterator[str]:
    """Each point of Spark's rule beside the ``speculate`` point (any price or floor) with `nurd` that
    shortens the jobs most at equal or lower gross machine time, on the real trace's reporting half
    (docs/results/equal-cost/*/summary.json; `straggler.report.equal_cost_rows`)."""
    yield (
        "| trace | Spark's rule | its JCT reduction | its gross machine time | best `speculate` + `nurd` as "
        "cheap | its JCT reduction | its gross machine time | its copies won | completion time |"
    )
    yield "|---|---|---|---|---|---|---|---|---|"
    for run in EQUAL_COST:
        summary = json.loads((RESULTS / "equal-cost" / run / "summary.json").read_text())
        rows = [row for row in equal_cost_rows(summary) if row[0] == "nurd"]
        for i, (_, spark, s, policy, m) in enumerate(rows):
            jobs = "every job" if run.endswith("every-job") else "60 largest"
            trace = f"real, {run.split('-')[1]} s, {jobs} ({summary['jobs']} jobs)" if i == 0 else ""
            left = (
                f"| {trace} | `{spark}` | {pct(s['jct_reduction'])} | {pct(s['gross_extra_machine_time'])} "
            )
            if policy is None:
                yield left + "| none as cheap | – | – | – | – |"
                continue
            won = m["copies_won"] / max(m["copies_won"] + m["copies_lost"], 1)
            diff = 100 * (m["jct_reduction"] - s["jct_reduction"])
            yield (
                left + f"| `{policy}` | {pct(m['jct_reduction'])} | {pct(m['gross_extra_machine_time'])} "
                f"| {won:.0%} | {completion_verdict(diff)} |"
            )


def truth_gate() -> Iterator[str]:
    """The limit against the same copies of the true stragglers made only once the job has a finished
    task, or 4 % of them, and the shipped policy told the truth: the real trace's every job, each half
    (docs/results/equal-cost/truth-gate-*.json, written by scripts/truth_gate.py)."""
    runs = {
        cps: json.loads((RESULTS / "equal-cost" / f"truth-gate-{cps}.json").read_text()) for cps in (60, 300)
    }
    columns = [(cps, half) for cps in runs for half in ("tune", "report")]
    yield "| rule | " + " | ".join(f"{cps} s, {half} half" for cps, half in columns) + " |"
    yield "|---|" + "---|" * len(columns)
    for rule in runs[60]["tune"]:
        cells = []
        for cps, half in columns:
            r = runs[cps][half][rule]
            won = r["copies_won"] / max(r["copies_won"] + r["copies_lost"], 1)
            cells.append(
                f"{pct(r['jct_reduction'])} at {pct(r['gross_extra_machine_time'])} gross, "
                f"{r['share_of_limit']:.2f} of the limit, {won:.0%} won"
            )
        yield f"| {rule} | " + " | ".join(cells) + " |"


def run_cost() -> Iterator[str]:
    """What the evaluation of the shipped configuration cost (`/usr/bin/time -v` of each run, kept as
    docs/results/shipped/<run>/time.txt; the machine was shared, so the wall clocks are upper bounds)."""
    yield "| run | jobs | scored tasks | predictors | wall clock | user + system CPU | peak RSS |"
    yield "|---|---|---|---|---|---|---|"
    for run in SHIPPED:
        summary = load(f"shipped/{run}")
        if not (RESULTS / "shipped" / run / "time.txt").exists():
            continue
        timing = (RESULTS / "shipped" / run / "time.txt").read_text()

        def field(label: str, text: str = timing) -> str:
            found = re.search(rf"{re.escape(label)}: (.+)", text)
            return found.group(1).strip() if found else "?"

        cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
        rss = int(field("Maximum resident set size (kbytes)")) / 2**20
        yield (
            f"| {run_name(run)} | {summary['jobs']} | {summary['tasks']:,} | {len(summary['methods'])} "
            f"| {field('Elapsed (wall clock) time (h:mm:ss or m:ss)')} | {math.ceil(cpu)} s | {rss:.2f} GiB |"
        )


def dask() -> Iterator[str]:
    """Real tasks on a Dask `LocalCluster`, each fault scenario under each policy: completion time
    (mean, sd, p99 over repetitions), the share of the straggler's cost recovered, gross extra worker
    time, copies won/lost (docs/results/dask/dask_jobs.json, written by bench/dask_jobs.py)."""
    figures = json.loads((RESULTS / "dask" / "dask_jobs.json").read_text())
    yield "| scenario | policy | finished | JCT mean (sd), s | p99, s | recovered | gross | copies won/lost |"
    yield "|---|---|---|---|---|---|---|---|"
    for r in figures["rows"]:
        recovered = "–" if r["recovered"] is None or math.isnan(r["recovered"]) else f"{r['recovered']:.0%}"
        yield (
            f"| {r['scenario']} | {r['policy']} | {r['finished']}/{r['reps']} | {r['jct_mean']:.1f} "
            f"({r['jct_std']:.1f}) | {r['jct_p99']:.1f} | {recovered} | {pct(r['gross'])} "
            f"| {r['copies_won']}/{r['copies_lost']} |"
        )


TABLES: dict[str, Callable[[], Iterator[str]]] = {
    "headline": headline,
    "shipped": shipped,
    "quality": quality,
    "seeds": seeds,
    "frontier": frontier,
    "equal-cost": equal_cost,
    "truth-gate": truth_gate,
    "others": others,
    "run-cost": run_cost,
    "sample": sample,
    "dask": dask,
}


MARKER = re.compile(r"^<!-- scripts/results_tables.py (\S+) -->$")


def render_page(text: str) -> str:
    """``text`` with the table after each marker line rendered anew."""
    out: list[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        out.append(line)
        marker = MARKER.match(line)
        if not marker:
            continue
        out.extend(TABLES[marker.group(1)]())
        for rest in lines:  # skip the old table, up to the blank line that ends it
            if not rest.strip():
                out.append(rest)
                break
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "tables", nargs="*", help=f"the tables to print, of: {', '.join(TABLES)} (default: all)"
    )
    parser.add_argument("--list", action="store_true", help="list the tables and their sources")
    parser.add_argument("--update", metavar="PAGE", help="re-render the tables of PAGE in place")
    parser.add_argument(
        "--check", metavar="PAGE", help="exit 1 when a table of PAGE differs from its rendering"
    )
    args = parser.parse_args()
    if args.list:
        for name, render in TABLES.items():
            print(f"{name}: {' '.join((render.__doc__ or '').split())}")
        return
    for page in (args.update, args.check):
        if page:
            text = Path(page).read_text()
            fresh = render_page(text)
            if args.update:
                Path(page).write_text(fresh)
            elif fresh != text:
                sys.exit(f"{page}: a table differs from what scripts/results_tables.py renders; run --update")
            return
    unknown = [name for name in args.tables if name not in TABLES]
    if unknown:
        parser.error(f"no table {', '.join(unknown)}; the tables: {', '.join(TABLES)}")
    for name in args.tables or TABLES:
        print(f"<!-- scripts/results_tables.py {name} -->")
        print("\n".join(TABLES[name]()))
        print()


if __name__ == "__main__":
    main()
