#!/bin/bash
# Run the broker (KRaft) on PROPERTIES, logging to stdout; the heap as the embedded broker's.
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m}"
export KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j.configuration=file:/opt/kafka/config/log4j.properties}"
exec "$(dirname "$(readlink -f "$0")")/kafka-run-class.sh" kafka.Kafka "$@"
