"""twblas inside PyTorch: the sparse FFN as compiled ops (autograd, torch.compile) and a module.

    y, l1 = sparse_ffn(x, w_gate, w_up, w_down)
    mlp = SparseMLP(d_model, d_ff, gated=True)

Weights use nn.Linear's layouts: w_gate, w_up (H, D) (gate_proj.weight, up_proj.weight), w_down
(D, H) (down_proj.weight). x is (..., D), in the weights' dtype (fp32, fp16 or bf16), on the CPU
or a CUDA device; y has x's shape and dtype. l1 is a 0-dim fp32 tensor: the mean over tokens of
sum_j |h_tj|, the paper's regulariser (the caller adds coefficient * l1 to its loss; its gradient
becomes the C API's l1Coeff).

w_down is read by the CUDA kernels in place, without a copy, when it is laid out as an H x D
row-major storage seen transposed: shape (D, H), strides (1, D). SparseMLP keeps its
down_proj.weight so (same Parameter type and shape: state_dicts load as they are);
down_weight_in_place_layout(p) re-lays any such Parameter. A contiguous (D, H) w_down works too
(the library then keeps a copy of it). w_gate and w_up in one storage, w_up's rows right after
w_gate's (a stacked [Wg; Wu]) let a dense-mode training step run the dense step's single dX and
[dWg; dWu] GEMMs; SparseMLP keeps them so, and gate_up_stacked_layout(g, u) re-lays any pair.

The ops are C++ (csrc/twblas_torch.cpp, libtwblas_torch.so, loaded here with
torch.ops.load_library): torch.ops.twblas.sparse_ffn, ffn_forward (y, l1 and the saved state),
ffn_backward, ffn_stats and ffn_neuron_counts. Their CPU and CUDA kernels call the C API directly
(a handle per thread and device on torch's current CUDA stream, FFN descriptors cached in C++ and
shared by all threads, workspaces from torch's allocator, nothing read back), and their autograd
is registered in C++, so an eager call leaves Python at the op call. twblas/_ops.py adds the fake
kernels for torch.compile and the module; twblas/_sparsify.py holds sparsify.
"""

from ._ops import SparseMLP, down_weight_in_place_layout, gate_up_stacked_layout, sparse_ffn
from ._sparsify import sparsify

__all__ = ["sparse_ffn", "SparseMLP", "down_weight_in_place_layout", "gate_up_stacked_layout", "sparsify"]

# the public name in reprs and pickles
for _f in (SparseMLP, down_weight_in_place_layout, gate_up_stacked_layout, sparse_ffn, sparsify):
    _f.__module__ = __name__
del _f
