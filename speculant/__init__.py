"""Speculant Graph: speculative decoding that drafts from a corpus n-gram graph.

Shared pieces used by every service: the graph, a suffix index of the tokenized corpus in one
LMDB environment (written by :mod:`speculant.graph_format`, read by :mod:`speculant.graph_reader`),
tokenizer loading and fingerprints (:mod:`speculant.tokenizer`), settings
(:mod:`speculant.config`), gRPC server helpers (:mod:`speculant.grpc_server`) and the generated
protobuf stubs (:mod:`speculant.v1`). The ``speculant`` command line is :mod:`launcher.cli`.
"""

__version__ = "0.1.0"
