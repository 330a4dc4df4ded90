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
workers=$(nproc 2>/dev/null || echo 1)
workers=$((workers < 2 ? workers : 2))
.venv/bin/pytest -n "$workers" --dist loadgroup "$@"
