#!/usr/bin/env bash
# The main job: set everything up, then replay the bundled real Google 2011 sample through a real
# (embedded) Apache Kafka broker with the closed loop on, and print the report. Everything else the
# run says (setup, the replay's progress and log lines, librdkafka's) goes to log files in the output
# directory; a failure prints its error line.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/demo}"
mkdir -p "$out"
if ! bash scripts/setup.sh >"$out/setup.log" 2>&1; then
    tail -n 20 "$out/setup.log" >&2
    echo "error: setup failed; its log: $out/setup.log" >&2
    exit 1
fi
if ! .venv/bin/straggler replay \
    --format google-2011 --trace data/google-2011-sample \
    --checkpoint-seconds 60 --policy speculate \
    --metrics-port "${METRICS_PORT:-9400}" \
    --out "$out" 2>"$out/replay.log"; then
    grep -E '^(error|straggler [a-z]+: error):' "$out/replay.log" >&2 || tail -n 5 "$out/replay.log" >&2
    echo "logs: $out/replay.log, $out/worker.log, $out/mitigator.log" >&2
    exit 1
fi
echo
# while it ran: curl -s 127.0.0.1:9400/metrics (worker), 127.0.0.1:9401/metrics (mitigator)
echo "report: $out/report.md  summary: $out/summary.json"
echo "logs: $out/replay.log, $out/worker.log, $out/mitigator.log, $out/setup.log"
