"""The decode worker: a gRPC server around an engine in the decode role."""
