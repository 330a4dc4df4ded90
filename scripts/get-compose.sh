#!/usr/bin/env bash
# Print the command of a Docker Compose this machine can have, obtaining it if needed:
#   1. `docker compose` (the v2 plugin) when installed;
#   2. Compose v2 built once from the Go module proxy with the local Go toolchain, cached under
#      ~/.cache/straggler-stream (a standalone `docker-compose` v2 binary);
#   3. Debian's docker-compose 1.29 ("legacy"; it predates the top-level `name` key, so callers give
#      it a copy of compose.yaml without `name`).
# Output: one line, the command words (e.g. "docker compose" or a path), then "legacy" as a second
# word for v1. Build logs go to stderr.
set -euo pipefail

COMPOSE_VERSION="${COMPOSE_VERSION:-v2.40.3}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/straggler-stream/compose-$COMPOSE_VERSION"
binary="$cache/docker-compose"

if docker compose version >/dev/null 2>&1; then
    echo "docker compose"
    exit 0
fi
if [ -x "$binary" ] && "$binary" version >/dev/null 2>&1; then
    echo "$binary"
    exit 0
fi

go=$(command -v go || true)
[ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
if [ -n "$go" ]; then
    echo "building Docker Compose $COMPOSE_VERSION with $($go version) (once; cached in $cache)" >&2
    # `go install module@version` refuses modules whose go.mod has replace directives (compose's
    # has), so fetch the module's source from the proxy and build inside it, honouring its go.mod.
    src=$("$go" mod download -json "github.com/docker/compose/v2@$COMPOSE_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || src=""
    if [ -n "$src" ] && mkdir -p "$cache" && (cd "$src" && CGO_ENABLED=0 nice "$go" build -trimpath \
            -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
            -o "$binary.tmp" ./cmd) >&2; then
        mv "$binary.tmp" "$binary"
        echo "$binary"
        exit 0
    fi
    echo "warning: building Compose $COMPOSE_VERSION failed; trying Debian's docker-compose" >&2
fi

if ! command -v docker-compose >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
if command -v docker-compose >/dev/null 2>&1; then
    echo "$(command -v docker-compose) legacy"
    exit 0
fi
echo "error: no Docker Compose: install the compose plugin, Go (to build it), or docker-compose" >&2
exit 1
