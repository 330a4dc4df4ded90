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
.venv/bin/pytest "$@"
