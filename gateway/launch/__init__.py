"""The gateway's commands: serve-gateway, generate and up (the three services as child processes),
and the plain Hugging Face baseline they are measured against."""
