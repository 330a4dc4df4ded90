#!/usr/bin/env bash
# The broker tests (pytest -m broker) once more, each pytest worker's broker a testcontainers
# KafkaContainer (tests/conftest.py) on the local Docker engine instead of the embedded broker.
# Needs an engine answering (CI runs this under scripts/with-docker.sh) and the broker image
# (scripts/build-local-images.sh: pulled, found or built). Ryuk, testcontainers' reaper, is used when
# its image can be had; where it cannot, it is disabled and the fixture's own `with` removes its
# containers. Containers an earlier, killed run left behind (the engine keeps them across restarts)
# are removed first; any this run leaves are removed after it and fail it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build-local-images.sh --broker-only
ryuk=$(.venv/bin/python -c 'from testcontainers.core.config import testcontainers_config as c; print(c.ryuk_image)')
if docker image inspect "$ryuk" >/dev/null 2>&1 || timeout 120 docker pull -q "$ryuk" >/dev/null 2>&1; then
    echo "== testcontainers: Ryuk ($ryuk) reaps the containers"
else
    echo "== testcontainers: $ryuk cannot be had; Ryuk disabled, the fixture removes its containers"
    export TESTCONTAINERS_RYUK_DISABLED=true
fi

leftovers() { docker ps -aq --filter label=org.testcontainers.session-id; }
earlier=$(leftovers)
if [ -n "$earlier" ]; then
    echo "== testcontainers: removing $(echo "$earlier" | wc -l) container(s) an earlier run left"
    docker rm -f $earlier >/dev/null
fi

status=0
unset KAFKA_BOOTSTRAP_SERVERS  # the fixture's first choice: it would bypass the container
# As scripts/test.sh runs pytest (its lint and type checks are not repeated): two xdist workers,
# each its own session with its own container.
workers=$(nproc 2>/dev/null || echo 1)
.venv/bin/pytest -n "$((workers < 2 ? workers : 2))" --dist loadgroup -m broker "$@" || status=$?

left=$(leftovers)
if [ -n "$left" ]; then
    echo "error: testcontainers left $(echo "$left" | wc -l) container(s); removing them" >&2
    docker ps -a --filter label=org.testcontainers.session-id \
        --format '  {{.ID}} {{.Image}} {{.Status}} created {{.CreatedAt}} ports {{.Ports}}' >&2
    docker rm -f $left >/dev/null
    status=1
fi
exit "$status"
