#!/usr/bin/env bash
# Make the images compose.yaml and the testcontainers fixture name available to the local Docker
# engine. Each is used as it is when the engine has it or can pull it; only where that fails is a
# local stand-in built from what a machine without a container registry can reach: Debian's
# packages (debootstrap, apt-get), Maven Central (the Kafka jars, as the embedded broker resolves
# them) and the package index (wheels built on the host). The stand-ins (deploy/images/):
#   debian:bookworm              debootstrap's minbase, imported with `docker import`
#   python:3.11-slim             Debian's Python 3.11 in a venv on PATH
#   apache/kafka:3.9.1           Kafka 3.9.1 on Debian's OpenJDK 17, configured by KAFKA_* variables
#   confluentinc/cp-kafka:7.9.0  the same broker, started as testcontainers' KafkaContainer starts it
# Then the project's own image, straggler-stream:latest (Dockerfile), is built; when pip inside the
# build cannot reach an index, from a wheelhouse built on the host (deploy/wheelhouse/, with the
# `dask` extra's wheels too). No certificate of this machine goes into any image.
# Needs a running Docker engine; root for debootstrap. Set LOCAL_IMAGES_NO_PULL=1 to skip pulls;
# `--broker-only` stops after the broker images (what the testcontainers run needs); `--dask` also
# builds straggler-stream-dask:latest (EXTRAS=dask: compose.yaml's `dask` profile).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGES=deploy/images
KAFKA_IMAGE=apache/kafka:3.9.1
CONFLUENT_IMAGE=confluentinc/cp-kafka:7.9.0
APP_IMAGE=straggler-stream:latest
DASK_IMAGE=straggler-stream-dask:latest
WHEELHOUSE=deploy/wheelhouse
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

log() { echo "== images: $*" >&2; }

# True when the engine has IMAGE or pulls it (bounded: a registry that does not answer can hang).
available() {
    docker image inspect "$1" >/dev/null 2>&1 && return 0
    [ "${LOCAL_IMAGES_NO_PULL:-0}" = 1 ] && return 1
    timeout 120 docker pull -q "$1" >/dev/null 2>&1
}

build() {  # build TAG CONTEXT [docker build options...]
    local tag="$1" context="$2"
    shift 2
    log "building $tag (stand-in) from $context"
    docker build -q -t "$tag" "$@" "$context" >/dev/null
}

# The Kafka jars and the wheelhouse come from the project's venv (scripts/setup.sh makes it).
[ -x .venv/bin/python ] || bash scripts/setup.sh

if ! available debian:bookworm; then
    command -v debootstrap >/dev/null || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    log "debootstrap bookworm (minbase) -> debian:bookworm"
    debootstrap --variant=minbase bookworm "$scratch/rootfs" >"$scratch/debootstrap.log" 2>&1 ||
        { tail -20 "$scratch/debootstrap.log" >&2; exit 1; }
    rm -rf "$scratch"/rootfs/var/cache/apt/archives/*.deb "$scratch"/rootfs/var/lib/apt/lists/*
    tar -C "$scratch/rootfs" -c . | docker import --change 'CMD ["bash"]' - debian:bookworm >/dev/null
    rm -rf "$scratch/rootfs"
fi

available python:3.11-slim || build python:3.11-slim "$IMAGES/python"

if ! available "$KAFKA_IMAGE"; then
    # The build context: the image's scripts plus the jars the embedded broker runs (resolved once
    # with mvn into ~/.cache/straggler-stream; hard links when on the same file system).
    libs=$(.venv/bin/python -c 'from straggler.kafka.embedded import ensure_kafka_jars; print(ensure_kafka_jars())')
    cp -r "$IMAGES/kafka" "$scratch/kafka"
    cp -rl "$libs" "$scratch/kafka/libs" 2>/dev/null || cp -r "$libs" "$scratch/kafka/libs"
    build "$KAFKA_IMAGE" "$scratch/kafka"
fi

available "$CONFLUENT_IMAGE" || build "$CONFLUENT_IMAGE" "$IMAGES/cp-kafka"
if [ "${1:-}" = --broker-only ]; then
    log "ready: $KAFKA_IMAGE $CONFLUENT_IMAGE"
    exit 0
fi

# The project's image, always built (the layer cache makes an unchanged tree cheap). pip in the
# build uses the index when it can reach one; otherwise PIP_NO_INDEX/PIP_FIND_LINKS point it at
# wheels built here on the host (the dependencies and pyproject's build requirements).
offline=()
if timeout 60 docker run --rm python:3.11-slim \
        pip download --no-deps --timeout 5 --retries 0 -d /tmp/probe pip >/dev/null 2>&1; then
    log "building $APP_IMAGE (pip reaches an index from the build)"
    docker build -q -t "$APP_IMAGE" . >/dev/null
else
    stamp="$WHEELHOUSE/.built-dask-$(sha256sum pyproject.toml | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
        log "no index from the build: wheels for $APP_IMAGE built on the host into $WHEELHOUSE"
        find "$WHEELHOUSE" -maxdepth 1 \( -name '*.whl' -o -name '.built-*' \) -delete
        requires=$(.venv/bin/python -c \
            'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
        # shellcheck disable=SC2086  # the build requirements are separate words
        .venv/bin/python -m pip wheel --quiet --wheel-dir "$WHEELHOUSE" '.[dask]' $requires
        rm -f "$WHEELHOUSE"/straggler_stream-*.whl  # the image installs the project from its source
        touch "$stamp"
    fi
    offline=(--build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/app/wheelhouse)
    log "building $APP_IMAGE offline from $WHEELHOUSE"
    docker build -q -t "$APP_IMAGE" "${offline[@]}" . >/dev/null
fi
if [ "${1:-}" = --dask ]; then
    log "building $DASK_IMAGE (the same layers plus the dask extra)"
    docker build -q -t "$DASK_IMAGE" "${offline[@]}" --build-arg EXTRAS=dask . >/dev/null
    APP_IMAGE="$APP_IMAGE $DASK_IMAGE"
fi
log "ready: debian:bookworm python:3.11-slim $KAFKA_IMAGE $CONFLUENT_IMAGE $APP_IMAGE"
