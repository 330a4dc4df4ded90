#!/usr/bin/env bash
# with-docker.sh COMMAND...: run COMMAND with a Docker engine answering. When none answers, `dockerd`
# is started here (bounded wait) and stopped again after COMMAND, whatever its outcome; an engine
# that was already running is left alone. Exits with COMMAND's status.
set -euo pipefail

DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"
if docker info >/dev/null 2>&1; then
    exec "$@"
fi

log=$(mktemp)
echo "== with-docker: starting dockerd (log: $log)" >&2
dockerd >"$log" 2>&1 &
dockerd_pid=$!
stop_dockerd() {
    kill "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$dockerd_pid" 2>/dev/null && { echo "warning: dockerd did not stop; killing it" >&2; kill -9 "$dockerd_pid"; }
    rm -f "$log"
}
trap stop_dockerd EXIT
for _ in $(seq "$DOCKERD_WAIT_S"); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 1
done
if ! docker info >/dev/null 2>&1; then
    tail -20 "$log" >&2
    echo "error: dockerd did not answer within ${DOCKERD_WAIT_S} s" >&2
    exit 1
fi
status=0
"$@" || status=$?
exit "$status"
