"""twblas: sparse feed-forward layers (TwELL and hybrid formats) on the twblas C library.

twblas.torch holds the PyTorch interface (sparse_ffn, SparseMLP); importing twblas alone needs
neither torch nor a GPU. twblas.__version__ is the C library's version (twblas.version() asks the
library itself).
"""

from ._lib import version

try:  # written by the package's build from the C library's CMake project version
    from ._version import __version__
except ImportError:  # a source tree (PYTHONPATH=bindings/python): ask the library when needed

    def __getattr__(name):
        if name == "__version__":
            return version()
        raise AttributeError(f"module 'twblas' has no attribute {name!r}")

__all__ = ["version", "__version__"]
