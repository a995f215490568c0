"""Starting numba without SciPy, for processes whose kernels use no BLAS (the draft service).

numba's array-math module checks at import whether BLAS is available by importing
``scipy.linalg.cython_blas``, which imports much of SciPy: about 0.2 s of a draft service's
start-up (``python -X importtime``; docs/benchmarks.md), for kernels (speculant.suffix_index)
that never call BLAS. :func:`import_numba_without_blas` imports that module with the SciPy
module hidden, so numba records "no BLAS" (``np.dot`` and ``np.linalg`` inside numba code of this
process then fail to compile; nothing the draft service runs uses them). SciPy itself stays
importable afterwards.
"""

from __future__ import annotations

import sys

_BLAS_MODULE = "scipy.linalg.cython_blas"


def import_numba_without_blas() -> None:
    """Import numba's array math with SciPy's BLAS hidden (nothing if it is already imported)."""
    if "numba.np.arraymath" in sys.modules or _BLAS_MODULE in sys.modules:
        return
    sys.modules[_BLAS_MODULE] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules[_BLAS_MODULE]
