"""What the Python test files share."""

import torch
from twblas.torch import sparse_ffn


def cuda_usable():
    """A CUDA device that this build of twblas can run on."""
    if not torch.cuda.is_available():
        return False
    try:
        sparse_ffn(torch.zeros(1, 8, device="cuda"), None, torch.zeros(8, 8, device="cuda"),
                   torch.zeros(8, 8, device="cuda"))
        return True
    except RuntimeError:  # a library built without the CUDA backend
        return False
