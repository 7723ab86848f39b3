"""One thread for BLAS: the embedder and the dense search each use one core, never all of them.

The gateway's cores serve requests; a matrix product that spreads over every core to save a
millisecond takes them from the event loop. OpenBLAS, MKL and OpenMP read their thread count
when they load, from the environment; numpy's bundled OpenBLAS also takes it at run time, so a
numpy imported before this module is pinned too.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")


def pin_blas_to_one_thread() -> None:
    """Asks every BLAS this process loads, or has loaded with numpy, for one thread.

    An operator's own setting of those variables is left as it is."""
    for variable in _VARIABLES:
        os.environ.setdefault(variable, "1")
    if "numpy" in sys.modules and os.environ["OPENBLAS_NUM_THREADS"] == "1":
        _pin_loaded_openblas()


def _pin_loaded_openblas() -> None:
    numpy = sys.modules["numpy"]
    libraries = Path(str(numpy.__file__)).parent.parent / "numpy.libs"
    for path in sorted(libraries.glob("lib*openblas*.so*")):
        try:
            library = ctypes.CDLL(str(path))
        except OSError:  # pragma: no cover - a broken wheel
            continue
        for setter in _SETTERS:
            function = getattr(library, setter, None)
            if function is not None:
                function(1)
                break
