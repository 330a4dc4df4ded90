#!/bin/bash
# Format (or inspect) the KRaft storage: kafka-storage.sh format -t CLUSTER_ID -c PROPERTIES.
exec "$(dirname "$(readlink -f "$0")")/kafka-run-class.sh" kafka.tools.StorageTool "$@"
