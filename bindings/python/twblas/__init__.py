"""twblas: sparse feed-forward layers (TwELL and hybrid formats) on the twblas C library.

twblas.torch holds the PyTorch interface (sparse_ffn, SparseMLP); importing twblas alone needs
neither torch nor a GPU.
"""

from ._lib import version

__all__ = ["version"]
