"""The gateway's front doors over its engine: the gRPC servicer (server) and the HTTP app, with
the catalog's admin door both use (admin).

The HTTP door, OpenAI's and vLLM's: app (the routes, reading bodies, uvicorn in its thread),
bodies (the request bodies as pydantic models), requests (bodies -> the engine's
PromptRequests), streaming (choices in worker threads, server-sent events) and answers
(OpenAI's shapes, logprob texts, tool calls, errors)."""
