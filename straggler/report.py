"""Turn an evaluation summary into what people compare: a Markdown table and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _fmt(value: Any) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"


def markdown_table(summary: dict[str, Any]) -> str:
    """Table 3 of the paper, plus lead time and completion-time gains with their cost."""
    lines = [
        "| method | TPR | FPR | FNR | F1 | lead time | JCT reduction (Alg. 2) | extra work (Alg. 2) "
        "| JCT reduction (Alg. 3, mean 100-900) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in summary["methods"].items():
        jct = summary["jct"][name]
        limited = [v["reduction"] for v in jct["limited"].values()]
        mean_limited = sum(limited) / len(limited) if limited else float("nan")
        lines.append(
            f"| {name} | {_fmt(m['tpr'])} | {_fmt(m['fpr'])} | {_fmt(m['fnr'])} | **{_fmt(m['f1'])}** "
            f"| {_fmt(m['lead_time'])} | {_fmt(jct['unlimited']['reduction'])} "
            f"| {_fmt(jct['unlimited']['extra_work'])} | {_fmt(mean_limited)} |"
        )
    return "\n".join(lines)


def mitigation_table(summary: dict[str, Any]) -> str:
    """Completion-time reduction per method and policy, what it cost (extra machine time gross and net
    over every task, scored or not; copies won / lost), and the share of the limit (every true straggler
    copied at its first checkpoint) it reaches; the oracle-fed control and the limit below."""
    lines = [
        "| method | policy | JCT reduction | extra machine time, gross | net | copies won / lost "
        "| share of the limit | jobs made longer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        (name, policy, m)
        for name, per_policy in summary["mitigation"].items()
        for policy, m in per_policy.items()
    ]
    oracle = summary.get("mitigation_oracle") or {}
    rows += [("*oracle-fed* (future information)", policy, m) for policy, m in oracle.items()]
    for name, policy, m in rows:
        limit = summary["mitigation_limit"][policy]["jct_reduction"]
        share = m["jct_reduction"] / limit if limit and limit > 0 else float("nan")
        lines.append(f"| {name} | {policy} | {_cost_cells(m)} | {_fmt(share)} | {m['jobs_longer']} |")
    below = [
        f"{name} / {policy} {m['jobs_below_reactive']}"
        for name, per_policy in summary["mitigation"].items()
        if name != "reactive"
        for policy, m in per_policy.items()
        if "jobs_below_reactive" in m
    ]
    limit_row = _limit_row(summary)
    if limit_row is not None:
        rule = "copy every true straggler at its first checkpoint"
        lines.append(f"| *limit* | {rule} | {_cost_cells(limit_row)} | 1.000 | 0 |")
    if below:
        lines += ["", "Jobs that finish later than under `reactive` (same policy): " + ", ".join(below) + "."]
    return "\n".join(lines)


def policy_family(policy: str) -> str | None:
    """``speculate`` (``speculate/F`` over floor F) for the cost-aware policy at any price (no pool),
    ``spark`` for Spark's rule at any multiplier, None for the others: the curves a frontier compares."""
    priced, _, floor = policy.partition("/")
    base = priced.partition("@")[0]
    if base == "speculate":
        return "speculate" if floor in ("", "spark-legacy") else f"speculate/{floor}"
    return "spark" if base in ("spark", "spark-legacy") and not floor else None


def _gross(m: dict[str, Any]) -> float:
    return float(m.get("gross_extra_machine_time", m["extra_machine_time"]))


def equal_cost_rows(
    summary: dict[str, Any],
) -> list[tuple[str, str, dict[str, Any], str | None, dict[str, Any]]]:
    """Per method and point of Spark's rule, the ``speculate`` point with the largest completion-time
    reduction at equal or lower gross machine time (None: none is that cheap):
    (method, spark policy, its figures, speculate policy, its figures)."""
    rows: list[tuple[str, str, dict[str, Any], str | None, dict[str, Any]]] = []
    for name, per_policy in summary["mitigation"].items():
        curve = [(p, m) for p, m in per_policy.items() if (policy_family(p) or "").startswith("speculate")]
        for spark, s in sorted(per_policy.items(), key=lambda item: _gross(item[1])):
            if policy_family(spark) != "spark" or not curve:
                continue
            cheaper = [(p, m) for p, m in curve if _gross(m) <= _gross(s)]
            best = max(cheaper, key=lambda item: item[1]["jct_reduction"], default=None)
            rows.append((name, spark, s, None if best is None else best[0], {} if best is None else best[1]))
    return rows


def completion_verdict(points: float) -> str:
    """How a ``speculate`` point's completion-time reduction compares with Spark's rule's, ``points``
    (percentage points) ahead: a difference that rounds to 0.00 is "the same", not a float's sign."""
    shown = f"{points:+.2f}"
    if shown in ("+0.00", "-0.00"):
        return "the same (+0.00 points)"
    return f"{'shorter' if points > 0 else 'not shorter'} ({shown} points)"


def frontier_table(summary: dict[str, Any]) -> str | None:
    """`equal_cost_rows` as Markdown (None: the summary has no ``speculate`` and Spark points to compare)."""
    rows = equal_cost_rows(summary)
    if not rows:
        return None
    lines = [
        "| method | Spark's rule | its JCT reduction | its gross machine time | best `speculate` as cheap "
        "| its JCT reduction | its gross machine time | completion time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, spark, s, policy, m in rows:
        left = f"| {name} | {spark} | {s['jct_reduction']:+.2%} | {_gross(s):+.2%} "
        if policy is None:
            lines.append(left + "| none as cheap | – | – | – |")
            continue
        verdict = completion_verdict(100 * (m["jct_reduction"] - s["jct_reduction"]))
        lines.append(left + f"| {policy} | {m['jct_reduction']:+.2%} | {_gross(m):+.2%} | {verdict} |")
    return "\n".join(lines)


def plot_frontier(summary: dict[str, Any], path: Path) -> bool:
    """Completion-time reduction against gross machine time: a curve per method of ``speculate`` at its
    prices and one of Spark's rule at its multipliers, and the limit. False (nothing drawn): fewer than
    two points of either curve."""
    curves = {
        (name, family): sorted(
            (_gross(m), m["jct_reduction"], p) for p, m in per_policy.items() if policy_family(p) == family
        )
        for name, per_policy in summary["mitigation"].items()
        for family in sorted({f for f in map(policy_family, per_policy) if f is not None})
    }
    if max((len(c) for c in curves.values()), default=0) < 2:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = _colours(list(summary["mitigation"]))
    for (name, family), points in curves.items():
        if not points:
            continue
        x, y, _ = zip(*points, strict=True)
        other = ":D" if family.endswith("/late") else ":v" if family.endswith("/gross") else "-.^"
        style = {"spark": "--s", "speculate": "-o"}.get(family, other)
        ax.plot(100 * np.array(x), 100 * np.array(y), style, color=colours[name], label=f"{name} / {family}")
        for xi, yi, label in points:
            ax.annotate(label, (100 * xi, 100 * yi), fontsize=6)
    limit_row = _limit_row(summary)
    if limit_row is not None:
        ax.scatter(100 * _gross(limit_row), 100 * limit_row["jct_reduction"], color="black", marker="*")
        ax.axhline(100 * limit_row["jct_reduction"], color="black", linestyle=":", label="limit")
    ax.set_xscale("symlog", linthresh=0.1)  # the comparisons that matter sit at a few tenths of a percent
    ax.set_xlim(left=0.0)
    ax.set_xlabel("extra machine time, gross (% of the jobs' work; logarithmic past 0.1)")
    ax.set_ylabel("completion-time reduction (%)")
    ax.set_title(
        f"Frontier: speculate at its prices, Spark's rule at its multipliers ({summary['jobs']} jobs)"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _cost_cells(m: dict[str, Any]) -> str:
    """JCT reduction, gross and net extra machine time, copies won / lost (summaries older than the
    gross figures show the scored tasks' extra time as net)."""
    gross = f"{m['gross_extra_machine_time']:+.2%}" if "gross_extra_machine_time" in m else "–"
    net = m.get("net_extra_machine_time", m["extra_machine_time"])
    copies = f"{m['copies_won']} / {m['copies_lost']}" if "copies_won" in m else "–"
    return f"{m['jct_reduction']:+.2%} | {gross} | {net:+.2%} | {copies}"


def plot_mitigation(summary: dict[str, Any], path: Path) -> None:
    """Completion-time reduction against extra machine time, one point per method and policy."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = _colours(list(summary["mitigation"]))
    markers = "osD^v<>PX*"
    policies = list(summary.get("policies") or next(iter(summary["mitigation"].values()), {}))

    def cost(m: dict[str, Any]) -> float:
        return 100 * m.get("gross_extra_machine_time", m["extra_machine_time"])

    for name, per_policy in summary["mitigation"].items():
        for policy, m in per_policy.items():
            ax.scatter(
                cost(m),
                100 * m["jct_reduction"],
                color=colours[name],
                marker=markers[policies.index(policy) % len(markers)],
                label=f"{name} / {policy}",
            )
    for policy, m in (summary.get("mitigation_oracle") or {}).items():
        ax.scatter(
            cost(m),
            100 * m["jct_reduction"],
            color="black",
            marker=markers[policies.index(policy) % len(markers)],
            facecolors="none",
            label=f"oracle-fed (future information) / {policy}",
        )
    limit = _limit(summary)
    if limit is not None:
        ax.axhline(100 * limit, color="black", linestyle="--", label="limit")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("extra machine time, gross (% of the jobs' work)")
    ax.set_ylabel("completion-time reduction (%)")
    ax.set_title(f"Mitigation: gain against cost ({summary['jobs']} jobs, {summary['threshold']} threshold)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _limit_row(summary: dict[str, Any]) -> dict[str, float] | None:
    """The limit on the summary's jobs (the same for every policy; None for older summaries)."""
    limits = summary.get("mitigation_limit")
    return next(iter(limits.values())) if limits else None


def _limit(summary: dict[str, Any]) -> float | None:
    """The completion-time reduction of the limit on the summary's jobs."""
    row = _limit_row(summary)
    return None if row is None else row["jct_reduction"]


def _colours(names: list[str]) -> dict[str, Any]:
    """One distinct colour per method, however many there are (the default cycle has ten)."""
    palette = plt.get_cmap("tab20")
    return {name: palette(i % 20) for i, name in enumerate(names)}


def plot_f1_over_time(summary: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = _colours(list(summary["methods"]))
    for name, m in summary["methods"].items():
        series = m["f1_over_time"]
        xs = [(i + 1) / len(series) for i in range(len(series))]
        ax.plot(xs, series, marker="o", label=name, color=colours[name])
    ax.set_xlabel("normalised job time")
    ax.set_ylabel("F1 of flags raised so far")
    ax.set_title(f"F1 over time ({summary['threshold']} threshold, {summary['jobs']} jobs)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_jct(summary: dict[str, Any], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(summary["jct"])
    reductions = [summary["jct"][n]["unlimited"]["reduction"] for n in names]
    extra = [summary["jct"][n]["unlimited"]["extra_work"] for n in names]
    xs = range(len(names))
    left.bar([x - 0.2 for x in xs], reductions, width=0.4, label="JCT reduction")
    left.bar([x + 0.2 for x in xs], extra, width=0.4, label="extra machine time")
    left.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
    limit = _limit(summary)
    if limit is not None:
        left.axhline(limit, color="black", linestyle="--", linewidth=1, label="limit (copies)")
    left.set_title("Algorithm 2 (unlimited machines)")
    left.legend(fontsize=8)
    left.grid(axis="y", alpha=0.3)
    for name in names:
        limited = summary["jct"][name]["limited"]
        right.plot(
            [int(m) for m in limited], [v["reduction"] for v in limited.values()], marker="o", label=name
        )
    if limit is not None:
        right.axhline(limit, color="black", linestyle="--", linewidth=1, label="limit (copies)")
    right.set_xlabel("spare machines")
    right.set_ylabel("JCT reduction")
    right.set_title("Algorithm 3 (limited machines)")
    right.grid(alpha=0.3)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(summary: dict[str, Any], out: Path, *, title: str, command: str) -> Path:
    """Write ``summary.json``, ``report.md`` and the plots into ``out``; returns the report path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    plot_f1_over_time(summary, out / "f1_over_time.png")
    plot_jct(summary, out / "jct.png")
    plot_mitigation(summary, out / "mitigation.png")
    frontier = ""
    table = frontier_table(summary)
    if plot_frontier(summary, out / "frontier.png") and table is not None:
        frontier = (
            "## At equal machine time\n\n"
            f"{table}\n\n"
            "Each point of Spark's rule beside the `speculate` point (any price) that shortens the jobs "
            "most at equal or lower gross machine time.\n\n![frontier](frontier.png)\n\n"
        )
    report = out / "report.md"
    report.write_text(
        f"# {title}\n\n"
        f"Command: `{command}`\n\n"
        f"Jobs: {summary['jobs']}{_half(summary.get('half'))}; scored tasks: {summary['tasks']}; "
        "excluded tasks (no latency: cut by the "
        f"window, killed, failed, or scheduled before the trace): {summary['excluded_tasks']}. "
        f"Threshold: {summary['threshold']} p{round(100 * summary['quantile'])}. "
        "Metrics are means over jobs.\n\n"
        "## Mitigation in the closed loop\n\n"
        f"{mitigation_table(summary)}\n\n"
        "Each policy acts on the method's verdicts while the simulated cluster carries out its commands "
        "(`straggler.simulation`): `relaunch` kills and restarts (the paper's Algorithm 2), `speculate` "
        "starts a copy beside the original when the expected completion-time saving is worth the extra "
        "machine time, and kills the loser; `speculate:M` has M spare machines per job. Extra machine "
        "time counts every attempt until it ended or was killed, beyond the trace's own runs.\n\n"
        "![mitigation](mitigation.png)\n\n"
        f"{frontier}"
        "## Prediction, and the paper's relaunch protocol (open loop)\n\n"
        f"{markdown_table(summary)}\n\n"
        "The completion-time columns relaunch on the open-loop flags "
        "(`straggler.simulation.relaunch_flagged`, as the paper does); extra work there is the killed "
        "originals' run time. The limit on the same "
        f"jobs and draws is {_fmt(_limit(summary))}.\n\n"
        "![F1 over time](f1_over_time.png)\n\n![JCT](jct.png)\n"
    )
    return report


def _half(half: str | None) -> str:
    """Which half of the trace's jobs the report covers (`straggler.traces.loading.job_half`)."""
    return "" if half is None else f" (the {half!r} half of the trace's jobs, by a hash of the job id)"
