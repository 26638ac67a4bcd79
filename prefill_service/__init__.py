"""The prefill worker: a gRPC server around an engine in the prefill role."""
