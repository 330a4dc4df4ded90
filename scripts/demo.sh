#!/usr/bin/env bash
# The main job: set everything up, then replay the bundled real Google 2011 sample through a real
# (embedded) Apache Kafka broker with the closed loop on, and print the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="${1:-runs/demo}"
.venv/bin/straggler replay \
    --format google-2011 --trace data/google-2011-sample \
    --checkpoint-seconds 60 --policy speculate \
    --metrics-port "${METRICS_PORT:-9400}" \
    --out "$out"
echo
# while it ran: curl -s 127.0.0.1:9400/metrics (worker), 127.0.0.1:9401/metrics (mitigator)
echo "report: $out/report.md  summary: $out/summary.json  logs: $out/worker.log, $out/mitigator.log"
