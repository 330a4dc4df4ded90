#!/usr/bin/env bash
# The whole test suite: lint, types, then pytest (broker tests start an embedded Kafka when no
# KAFKA_BOOTSTRAP_SERVERS is set and no Docker engine answers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== import contracts"
.venv/bin/lint-imports
echo "== pytest"
# Two pytest-xdist workers (fewer on a one-core machine). Each worker is its own pytest session, so
# each starts its own embedded broker (free ports, its own temporary data directory); a module whose
# tests share one pipeline or broker is an xdist_group, kept on one worker by --dist loadgroup.
# Arguments given here come last, so `-n 0` runs everything in this process.
# In two runs, each timed: first everything but the long end-to-end scenarios (the budget a developer
# reruns often: under 8 minutes on 2 cores), then the scenarios (marker `scenario`: fault scenarios,
# the browser, a Dask cluster, the TLS pipeline). Both always run; the command fails if either fails.
workers=$(nproc 2>/dev/null || echo 1)
workers=$((workers < 2 ? workers : 2))
# Arguments given here go to both runs (a run that then selects no test, pytest's exit 5, is fine as
# long as the other ran some).
status=0
empty=0
for part in "not scenario" "scenario"; do
    echo "== pytest -m \"$part\""
    started=$SECONDS
    code=0
    .venv/bin/pytest -n "$workers" --dist loadgroup -m "$part" "$@" || code=$?
    echo "== pytest -m \"$part\": $((SECONDS - started)) s, exit $code"
    if [ "$code" -eq 5 ]; then
        empty=$((empty + 1))
    elif [ "$code" -ne 0 ]; then
        status=$code
    fi
done
[ "$empty" -lt 2 ] || status=5
exit "$status"
