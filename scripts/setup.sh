#!/usr/bin/env bash
# Create .venv (if needed) and install straggler-stream with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    echo "error: Python 3.11 or newer is required (found: $("$PYTHON" --version 2>&1 || echo none))." >&2
    exit 1
fi
for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: '$tool' is not on PATH. Install Java 17+ and Apache Maven (e.g. apt-get install openjdk-17-jre-headless maven)." >&2
        exit 1
    fi
done

# Debian packages some tests drive, as a user would: headless Chromium renders the live view
# (tests/test_liveview.py), kcat attaches a foreign producer (tests/test_foreign_producer.py).
# Installed when missing and we are root with apt-get; otherwise those tests fail, so say so.
missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
# `docker compose config` validates compose.yaml in tests/test_compose.py; without Compose v2, Debian's
# docker-compose (no Docker engine needed to validate).
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
    missing+=(docker-compose)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "warning: ${missing[*]} missing, and only root with apt-get can install them here: install them" \
            "yourself (sudo apt-get install ${missing[*]}), or the tests that use them fail" \
            "(tests/test_liveview.py, tests/test_foreign_producer.py, tests/test_compose.py)." >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# The test tools, PyOD (the `outliers` extra) so the outlier-detector baselines are tested too, and
# Dask `distributed` (the `dask` extra) so the Dask telemetry plugin and executor are tested too.
# PyTorch (`start`, START's training) is left out: large, and only its `torch`-marked tests need it.
extras="test,outliers,dask"
stamp=.venv/.installed-$( (cat pyproject.toml; echo "$extras") | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$extras]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
