"""Generated protobuf and gRPC stubs for package ``speculant.v1``.

Do not edit: regenerate with ``python scripts/generate_protos.py`` after changing ``protos/``.
"""
