"""Embedded Apache Kafka, topic declarations and client configurations."""
