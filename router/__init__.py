"""The public face: gRPC and OpenAI-compatible HTTP over a ``Backend``, with admission control."""
