"""consumers stage of straggler-stream."""
