"""BLAS thread pools kept within the cores while replicas run side by side.

numpy's BLAS (OpenBLAS, MKL, BLIS) starts a pool of one thread per core for
each matrix product. Two replicas that each call numpy would run two such
pools on the same cores and fight (10-13x slower than one replica, measured
in docs/benchmarks.md). While a run of several local replicas is in flight,
every BLAS library loaded in the process is held to at most
usable cores // replicas threads (threadpoolctl finds them), and given back
its own number afterwards. A library already at fewer threads (the user set
OPENBLAS_NUM_THREADS=1) keeps its number: this only lowers.
DISTRIBUTE_LIMIT_BLAS_THREADS=0 turns it off.
"""

import os
import sys
import threading

try:
    import threadpoolctl as _threadpoolctl
except ImportError:  # Debian's python3-threadpoolctl; without it nothing is limited
    _threadpoolctl = None

_lock = threading.Lock()
_active = 0  # runs of several replicas now in flight, on any thread
_restore = []  # (library, its own thread count) while _active > 0
_controller = None
_modules_scanned = -1  # len(sys.modules) when the libraries were last looked for


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _enabled():
    return _threadpoolctl is not None and os.environ.get("DISTRIBUTE_LIMIT_BLAS_THREADS", "1") != "0"


def _blas_libraries():
    # Looking costs milliseconds; it is done again only when a module was
    # imported since (one may have loaded another BLAS, as torch does).
    global _controller, _modules_scanned
    if _controller is None or len(sys.modules) != _modules_scanned:
        _modules_scanned = len(sys.modules)
        _controller = _threadpoolctl.ThreadpoolController()
    return [lib for lib in _controller.lib_controllers if lib.user_api == "blas"]


class limited:
    """`with limited(replicas):` around a run of `replicas` local replicas."""

    def __init__(self, replicas):
        self._on = replicas > 1 and _enabled()
        self._threads = max(1, usable_cores() // max(1, replicas))

    def __enter__(self):
        global _active
        if not self._on:
            return self
        with _lock:
            if _active == 0:
                try:
                    for lib in _blas_libraries():
                        own = lib.num_threads
                        if own > self._threads:
                            lib.set_num_threads(self._threads)
                            _restore.append((lib, own))
                except Exception:  # a library that cannot be asked: it is left as it is, and so are the rest
                    for lib, own in _restore:
                        lib.set_num_threads(own)
                    _restore.clear()
                    raise
            _active += 1
        return self

    def __exit__(self, *exc):
        global _active
        if not self._on:
            return False
        with _lock:
            _active -= 1
            if _active == 0:
                for lib, own in _restore:
                    lib.set_num_threads(own)
                _restore.clear()
        return False


def current_threads():
    """{library path: threads} of the BLAS libraries loaded (for tests and docs)."""
    if _threadpoolctl is None:
        return {}
    return {lib.filepath: lib.num_threads for lib in _threadpoolctl.ThreadpoolController().lib_controllers
            if lib.user_api == "blas"}
