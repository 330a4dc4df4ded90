"""Render the completion-time and ablation tables of docs/results.md from the runs' summary.json files.

Every number in those tables comes from a ``summary.json`` under docs/results/; nothing is typed by
hand. Run from the repository root: ``.venv/bin/python docs/results/render_tables.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent


def load(run: str) -> dict[str, Any]:
    return dict(json.loads((RESULTS / run / "summary.json").read_text()))


def pct(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:+.1f} %"


def share(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:.1f} %"


def num(value: float) -> str:
    return "n/a" if value != value else f"{value:.3f}"


def jct_table(run: str, methods: list[str] | None = None) -> str:
    """JCT reduction with the extra machine time beside it: Algorithm 2, then Algorithm 3 per pool size."""
    summary = load(run)
    names = methods or list(summary["jct"])
    counts = list(next(iter(summary["jct"].values()))["limited"])
    header = "| method | Alg. 2 | " + " | ".join(f"Alg. 3, {m}" for m in counts) + " |"
    lines = [header, "|---" * (len(counts) + 2) + "|"]
    for name in names:
        jct = summary["jct"][name]
        cells = [f"{pct(jct['unlimited']['reduction'])} ({share(jct['unlimited']['extra_work'])})"]
        for m in counts:
            limited = jct["limited"][m]
            cells.append(f"{pct(limited['reduction'])} ({share(limited['extra_work'])})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def key_table(runs: list[tuple[str, str]], methods: list[str]) -> str:
    """The headline comparison: a few methods across runs."""
    lines = [
        "| run | method | F1 | TPR | FPR | lead time | JCT Alg. 2 (extra machine time) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, run in runs:
        summary = load(run)
        for name in methods:
            if name not in summary["methods"]:
                continue
            m, jct = summary["methods"][name], summary["jct"][name]["unlimited"]
            lines.append(
                f"| {label} | {name} | {num(m['f1'])} | {num(m['tpr'])} | {num(m['fpr'])} "
                f"| {num(m['lead_time'])} | {pct(jct['reduction'])} ({share(jct['extra_work'])}) |"
            )
    return "\n".join(lines)


def ablation_table(variants: list[tuple[str, str]], method: str = "nurd") -> str:
    lines = [
        "| features | F1 | TPR | FPR | lead time | JCT Alg. 2 (extra machine time) "
        "| JCT Alg. 3, mean 100-900 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, run in variants:
        summary = load(run)
        m, jct = summary["methods"][method], summary["jct"][method]
        limited = [v["reduction"] for v in jct["limited"].values()]
        lines.append(
            f"| {label} | {num(m['f1'])} | {num(m['tpr'])} | {num(m['fpr'])} | {num(m['lead_time'])} "
            f"| {pct(jct['unlimited']['reduction'])} ({share(jct['unlimited']['extra_work'])}) "
            f"| {pct(sum(limited) / len(limited))} |"
        )
    return "\n".join(lines)


def timing_table(runs: list[str]) -> str:
    """Wall time, CPU time and peak RSS of each run, from the ``/usr/bin/time -v`` lines in its log."""
    lines = ["| run | wall clock | user + system CPU | peak RSS (largest process) |", "|---|---|---|---|"]
    for run in runs:
        log = (RESULTS / "logs" / f"{run}.log").read_text(errors="replace")
        fields = dict(
            line.strip().split(": ", 1) for line in log.splitlines() if line.startswith("\t") and ": " in line
        )
        cpu = float(fields["User time (seconds)"]) + float(fields["System time (seconds)"])
        rss_gb = int(fields["Maximum resident set size (kbytes)"]) / 1024**2
        wall = fields["Elapsed (wall clock) time (h:mm:ss or m:ss)"]
        lines.append(f"| {run} | {wall} | {cpu:.0f} s | {rss_gb:.2f} GiB |")
    return "\n".join(lines)


def density_table() -> str:
    """From ``trace-stats/*.json``: how many true stragglers a checkpointed rule can see at all."""
    lines = [
        "| jobs | checkpoint | checkpoints per job (p10 / median / p90) | stragglers running at some "
        "checkpoint | stragglers running past p90 at some checkpoint (pooled / mean over jobs) |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("google-300s", "all 484"),
        ("google-60s", "all 484"),
        ("google-300s-150-largest", "150 largest"),
        ("google-60s-150-largest", "150 largest"),
    ):
        st = json.loads((RESULTS / "trace-stats" / f"{name}.json").read_text())
        cp = st["checkpoints_per_job"]
        lines.append(
            f"| {label} | {st['checkpoint_seconds']:.0f} s | {cp['p10']:.0f} / {cp['median']:.0f} / "
            f"{cp['p90']:.0f} | {share(st['share_running_at_a_checkpoint'])} "
            f"| {share(st['share_running_past_p90_at_a_checkpoint'])} / "
            f"{share(st['mean_over_jobs_share_running_past_p90_at_a_checkpoint'])} |"
        )
    return "\n".join(lines)


def skill_table() -> str:
    """From ``feature-skill/*.json``: hindsight out-of-fold R^2 of NURD's regressor per feature set."""
    lines = [
        "| trace | features | mean R² | median R² | jobs with R² > 0.1 |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("google-150-largest", "real, 150 largest"), ("synthetic-40", "synthetic, 40 jobs")):
        st = json.loads((RESULTS / "feature-skill" / f"{name}.json").read_text())
        for variant, r2 in st["r2_out_of_fold"].items():
            lines.append(
                f"| {label} | {variant} | {num(r2['mean'])} | {num(r2['median'])} "
                f"| {share(r2['share_of_jobs_above_0.1'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    headline = ["nurd", "nurd-paper", "gbtr", "reactive", "tobit"]
    sections = {
        "timings": timing_table(
            [
                "google-300s-nurd-timing",
                "google-300s-online",
                "google-300s-oracle",
                "google-60s-online",
                "google-60s-oracle",
                "google-150-largest-300s-oracle",
                "google-150-largest-60s-oracle",
                "synthetic-online",
                "synthetic-oracle",
                "synthetic-pyod",
                "ablation-google-no-machine",
                "ablation-google-no-own-history",
                "ablation-google-no-schedule-delay",
                "ablation-synthetic-no-cpi",
                "ablation-synthetic-no-machine-load",
                "ablation-synthetic-events-only",
                "usage-fixture",
            ]
        ),
        "key": key_table(
            [
                ("real, 300 s, online", "google-300s-online"),
                ("real, 300 s, oracle", "google-300s-oracle"),
                ("real, 60 s, online", "google-60s-online"),
                ("real, 60 s, oracle", "google-60s-oracle"),
                ("synthetic, 60 s, online", "synthetic-online"),
                ("synthetic, 60 s, oracle", "synthetic-oracle"),
            ],
            headline,
        ),
        "density": density_table(),
        "skill": skill_table(),
        "key 150 largest": key_table(
            [
                ("150 largest, 300 s, oracle", "google-150-largest-300s-oracle"),
                ("150 largest, 60 s, oracle", "google-150-largest-60s-oracle"),
            ],
            ["reactive", "gbtr"],
        ),
        "jct google-300s-online": jct_table("google-300s-online"),
        "jct google-300s-oracle": jct_table("google-300s-oracle"),
        "jct google-60s-online": jct_table("google-60s-online"),
        "jct google-60s-oracle": jct_table("google-60s-oracle"),
        "jct synthetic-online": jct_table("synthetic-online"),
        "jct synthetic-oracle": jct_table("synthetic-oracle"),
        "jct synthetic-pyod": jct_table("synthetic-pyod"),
        "ablation google": ablation_table(
            [
                ("all 14 features", "google-60s-online"),
                ("without machine context (5)", "ablation-google-no-machine"),
                ("without own history (2)", "ablation-google-no-own-history"),
                ("without schedule_delay", "ablation-google-no-schedule-delay"),
            ]
        ),
        "ablation synthetic": ablation_table(
            [
                ("all 10 features", "synthetic-online"),
                ("without cpi", "ablation-synthetic-no-cpi"),
                ("without machine_load", "ablation-synthetic-no-machine-load"),
                ("evictions, failures only", "ablation-synthetic-events-only"),
            ]
        ),
    }
    text = "".join(f"<!-- {name} -->\n{table}\n\n" for name, table in sections.items())
    (RESULTS / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
