"""straggler-stream: online straggler prediction (NURD) and mitigation on Apache Kafka."""

__version__ = "0.1.0"
