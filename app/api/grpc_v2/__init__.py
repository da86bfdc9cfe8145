"""The Open Inference Protocol over gRPC (KServe V2's `inference.GRPCInferenceService`, as Triton
serves it): messages.py declares its messages, server.py serves them on GRPC_PORT."""
