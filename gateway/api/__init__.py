"""The gateway's front doors over its engine: the gRPC servicer and the HTTP app (OpenAI-compatible
bodies and answers, server-sent events)."""
