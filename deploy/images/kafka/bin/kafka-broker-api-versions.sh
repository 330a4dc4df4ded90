#!/bin/bash
# The broker's API versions: compose's healthcheck asks it of localhost:9092.
exec "$(dirname "$(readlink -f "$0")")/kafka-run-class.sh" kafka.admin.BrokerApiVersionsCommand "$@"
