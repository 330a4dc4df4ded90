"""What collaborative ADMM ships per round against shipping the data, on a trace's partitions.

All jobs of the trace form one training window; each job's finished tasks go to its Kafka partition
(murmur2 of the job id, 8 partitions by default), exactly as `Admm.fit_population` builds its nodes.
The script runs consensus ADMM in-process (the method's defaults: rho = lambda = 1, Boyd residual
tolerances 1e-4 abs / 1e-3 rel, at most 200 rounds), then the same rounds over Kafka
(`straggler.kafka.admm_exchange.run_kafka_consensus`, on ``--bootstrap`` or an embedded broker bound to
127.0.0.1), and reports rounds, bytes and the largest weight difference between the two runs and
against the centralised solution. Run from the repository root:

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python docs/results/admm/admm_bytes.py \
        --format google-2011 --trace ../shared/traces/google-2011 --checkpoint-seconds 300 \
        --out docs/results/admm/admm_bytes.json
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from straggler.core.admm import (
    Admm,
    NodeData,
    centralised_logistic,
    fit_consensus,
    node_moments,
    partition_datasets,
    standardiser_from_moments,
)
from straggler.traces.loading import add_trace_arguments, load_traces_from_args


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_arguments(parser)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--bootstrap", default=None, help="a broker (default: start an embedded one)")
    parser.add_argument("--no-kafka", action="store_true", help="skip the Kafka run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    traces = load_traces_from_args(args)
    defaults = Admm(n_partitions=args.partitions)
    raw = partition_datasets(traces, args.partitions, defaults.straggler_factor)
    scaler = standardiser_from_moments([node_moments(d.X) for d in raw])
    nodes = [NodeData(scaler.transform(d.X), d.y) for d in raw]
    options: dict[str, Any] = {
        "rho": defaults.rho,
        "lam": defaults.lam,
        "eps_abs": defaults.eps_abs,
        "eps_rel": defaults.eps_rel,
    }

    began = time.perf_counter()
    weights, history = fit_consensus(nodes, defaults.rounds, **options)
    in_process_s = time.perf_counter() - began
    central = centralised_logistic(nodes, defaults.lam)
    report: dict[str, Any] = {
        "trace": args.format,
        "jobs": len(traces),
        "features": list(traces[0].feature_names),
        "node_rows": [d.n for d in nodes],
        "node_stragglers": [int(d.y.sum()) for d in nodes],
        "in_process": {**history.summary(), "seconds": round(in_process_s, 2)},
        "max_abs_gap_to_centralised": float(np.max(np.abs(weights - central))),
        "data_over_star_total": history.data_bytes / history.summary()["bytes_star_total"],
    }
    report["residuals"] = [
        {
            "round": r.round,
            "primal": r.primal,
            "dual": r.dual,
            "eps_primal": r.eps_primal,
            "eps_dual": r.eps_dual,
        }
        for r in history.rounds
    ]

    if not args.no_kafka:
        from straggler.kafka.admm_exchange import run_kafka_consensus
        from straggler.kafka.embedded import embedded_kafka
        from straggler.kafka.names import TopicNames

        broker: AbstractContextManager[str] = (
            nullcontext(args.bootstrap) if args.bootstrap else embedded_kafka()
        )
        with broker as bootstrap:
            topic = TopicNames(f"admm-bytes-{int(time.time())}-").admm_exchange
            began = time.perf_counter()
            k_weights, k_history = run_kafka_consensus(
                bootstrap, topic, nodes, defaults.rounds, round_timeout=120.0, **options
            )
            kafka_s = time.perf_counter() - began
        report["kafka"] = {
            **k_history.summary(),
            "seconds": round(kafka_s, 2),
            "records_read_per_round_by_node_0": sorted(set(k_history.messages_per_round)),
            "max_abs_difference_to_in_process": float(np.max(np.abs(k_weights - weights))),
            "bit_identical_to_in_process": bool(np.array_equal(k_weights, weights)),
        }

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    brief = {k: v for k, v in report.items() if k != "residuals"}
    print(json.dumps(brief, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
