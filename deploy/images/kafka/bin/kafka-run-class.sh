#!/bin/bash
# kafka-run-class.sh CLASS ARGS...: run one of Kafka's main classes on the image's jars (what Kafka's
# own script does, without its many options). Tools log warnings only, to stderr.
log4j="${KAFKA_LOG4J_OPTS:--Dlog4j.configuration=file:/opt/kafka/config/tools-log4j.properties}"
exec java ${KAFKA_HEAP_OPTS:-} ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:-UsePerfData -Djava.awt.headless=true} \
    $log4j ${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' "$@"
