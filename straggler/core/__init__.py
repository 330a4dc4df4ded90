"""The functional core: per-job state, NURD, baselines, thresholds, metrics, schedulers. No Kafka here."""
