"""pipeline stage of straggler-stream."""
