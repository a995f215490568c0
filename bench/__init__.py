"""Tools that drive the whole system from above: benchmarks (``speculant bench ...``), the
bounded load test (``speculant load``) and the mixing tuner's replay harness (``speculant
tune``). Nothing in ``speculant/``, ``builder/``, ``draft_service/``, ``verifier_service/`` or
``gateway/`` imports this package."""
