#!/usr/bin/env bash
# Run compose.yaml's replay to its end on the local Docker engine and check it, as CI does:
#   1. a Docker engine: the running one, else `dockerd` started for this run (scripts/with-docker.sh);
#   2. the images (scripts/build-local-images.sh: pulled, found, or built as local stand-ins);
#   3. a Compose (scripts/get-compose.sh: the v2 plugin, v2 built once from the Go module proxy,
#      or Debian's v1 on a copy of compose.yaml without the top-level `name` it rejects);
#   4. `compose up -d`, then wait for the replayer to exit; its summary must show commands applied,
#      no delivery failure and nothing undecodable, and the dead-letter topic must be empty;
#   5. `compose down -v` whatever happened. Exits non-zero on any failure; prints the summary line
#      and the wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. The engine: without one answering, run again under with-docker.sh, which starts and stops it.
export COMPOSE_CHECK_STARTED="${COMPOSE_CHECK_STARTED:-$(date +%s)}"  # the wall time counts from here
if ! docker info >/dev/null 2>&1; then
    exec bash scripts/with-docker.sh bash scripts/compose-check.sh "$@"
fi

REPLAY_TIMEOUT_S="${REPLAY_TIMEOUT_S:-900}"
PROJECT=straggler-stream
scratch=$(mktemp -d)
compose=()

stop_all() {
    local status=$?
    if [ "${#compose[@]}" -gt 0 ]; then
        [ "$status" -eq 0 ] || "${compose[@]}" logs --no-color --tail 40 >&2 || true
        "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || echo "warning: compose down failed" >&2
    fi
    rm -rf "$scratch"
    echo "compose-check: $([ "$status" -eq 0 ] && echo passed || echo FAILED) in $(($(date +%s) - COMPOSE_CHECK_STARTED)) s"
}
trap stop_all EXIT

# 2. The images.
bash scripts/build-local-images.sh

# 3. A Compose.
words=$(bash scripts/get-compose.sh)  # fails the script when no Compose can be had
read -r -a found <<<"$words"
if [ "${found[-1]}" = legacy ]; then
    sed '/^name:/d' compose.yaml >"$scratch/compose.yaml"
    compose=("${found[@]:0:${#found[@]}-1}" -p "$PROJECT" -f "$scratch/compose.yaml" --project-directory .)
else
    compose=("${found[@]}" -p "$PROJECT" -f compose.yaml)
fi
echo "== compose-check: $("${compose[@]}" version 2>/dev/null | head -1)"

# 4. The replay: everything but the monitoring profile, until the replayer exits.
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true  # what a killed earlier run left: its broker's data too
"${compose[@]}" up -d --no-build
replayer=$("${compose[@]}" ps -q replayer)
status=$(timeout "$REPLAY_TIMEOUT_S" docker wait "$replayer") || { echo "error: the replayer ran longer than ${REPLAY_TIMEOUT_S} s" >&2; exit 1; }
docker logs "$replayer" >"$scratch/replayer.log" 2>&1
[ "$status" -eq 0 ] || { tail -20 "$scratch/replayer.log" >&2; echo "error: the replayer exited $status" >&2; exit 1; }
summary=$(grep '^{.*"commands_applied"' "$scratch/replayer.log" | tail -1)
[ -n "$summary" ] || { tail -20 "$scratch/replayer.log" >&2; echo "error: the replayer printed no summary" >&2; exit 1; }
# Records on the dead-letter topic (its partitions' high watermarks), asked from the worker's container.
dead_letters=$(docker exec "$("${compose[@]}" ps -q worker)" python -c '
from confluent_kafka import Consumer, TopicPartition
from straggler.kafka.topics import DEAD_LETTERS
consumer = Consumer({"bootstrap.servers": "kafka:9092", "group.id": "compose-check"})
partitions = consumer.list_topics(DEAD_LETTERS, timeout=30).topics[DEAD_LETTERS].partitions
print(sum(consumer.get_watermark_offsets(TopicPartition(DEAD_LETTERS, p), timeout=30)[1] for p in partitions))
consumer.close()')
echo "replayer summary: $summary"
SUMMARY="$summary" DEAD_LETTERS="$dead_letters" python3 - <<'PY'
import json, os, sys

s = json.loads(os.environ["SUMMARY"])
dead = int(os.environ["DEAD_LETTERS"])
shown = ("commands_applied", "jobs", "relaunched_tasks", "mean_jct_before", "mean_jct_after",
         "delivery_failures", "undecodable", "wall_seconds")
print("compose-check:", " ".join(f"{key}={s[key]}" for key in shown), f"dead_letters={dead}")
checks = {
    "no command applied": s["commands_applied"] > 0,
    "delivery failures": s["delivery_failures"] == 0,
    "undecodable records": s["undecodable"] == 0,
    "dead letters": dead == 0,
}
failed = [name for name, ok in checks.items() if not ok]
sys.exit("error: " + ", ".join(failed) if failed else 0)
PY
