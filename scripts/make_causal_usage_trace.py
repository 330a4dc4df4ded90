"""Write a held-out Google 2011 usage trace with known straggler causes (straggler.traces.causal_usage).

    python scripts/make_causal_usage_trace.py --jobs 60 --seed 2027 --out /tmp/causal60
    straggler evaluate --format google-2011-usage --trace /tmp/causal60 ...

Writes task_events/ and task_usage/ (gzipped CSV parts, the clusterdata-2011-2 layout) and
ground_truth.csv.gz (each attempt's slowdown factors per cause; the loader does not read it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from straggler.traces.causal_usage import write_causal_usage_trace  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=60, help="number of jobs (100–2000 tasks each)")
    parser.add_argument("--seed", type=int, default=2027, help="the same seed writes the same files")
    parser.add_argument("--out", type=Path, required=True, help="trace directory to write")
    parser.add_argument("--parts", type=int, default=4, help="part files per table")
    args = parser.parse_args(argv)
    summary = write_causal_usage_trace(args.out, args.jobs, args.seed, parts=args.parts)
    print(
        f"wrote {summary.jobs} jobs, {summary.tasks} tasks, {summary.attempts} attempts, "
        f"{summary.usage_rows} usage windows to {summary.out_dir}"
    )
    mix = ", ".join(f"{cause} {share:.1%}" for cause, share in summary.mix.items())
    print(f"{summary.stragglers} stragglers (latency >= job p90) by dominant cause: {mix}")


if __name__ == "__main__":
    main()
