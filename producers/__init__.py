"""producers stage of straggler-stream."""
