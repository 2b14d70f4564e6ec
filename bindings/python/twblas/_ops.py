"""The ops (loaded from the C++ op library), their fake kernels for torch.compile, sparse_ffn and
SparseMLP: what twblas.torch exports (see its docstring).
"""

import os
from typing import Optional, Tuple

_REINSTALL = (
    "reinstall the package with torch present: `pip install --no-build-isolation ./bindings/python` "
    "from the twblas repository (torch, scikit-build-core, cmake and ninja installed in this environment "
    "first); the package's ops are built against the installed torch and must be rebuilt after torch changes")

try:
    import torch
    from torch import Tensor
except ImportError as e:
    raise ImportError(f"twblas.torch needs PyTorch ({e}): install torch, then {_REINSTALL}") from e

from . import _lib

__all__ = ["sparse_ffn", "SparseMLP", "down_weight_in_place_layout", "gate_up_stacked_layout"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_ops():
    # TWBLAS_TORCH_LIBRARY points at another build of the op library (development). With
    # TWBLAS_LIBRARY set, that libtwblas is loaded first, so the op library uses it (same SONAME).
    path = os.environ.get("TWBLAS_TORCH_LIBRARY") or os.path.join(_HERE, "libtwblas_torch.so")
    if not os.path.exists(path):
        raise ImportError(f"twblas.torch: the PyTorch ops were not built ({path} is missing: torch was not "
                          f"importable when the package was built); {_REINSTALL}")
    if os.environ.get("TWBLAS_LIBRARY"):
        _lib.lib()
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as e:  # another torch's build (symbols), or another twblas op library
        raise ImportError(f"twblas.torch: cannot load {path} ({e}); {_REINSTALL}") from e


if not hasattr(torch.ops.twblas, "ffn_forward"):  # a second import after a reload
    _load_ops()

_sparse_ffn_op = torch.ops.twblas.sparse_ffn.default
_ffn_forward = torch.ops.twblas.ffn_forward.default
_ffn_backward = torch.ops.twblas.ffn_backward.default

# ---------------------------------------------------------------------------------------------
# fake kernels (torch.compile); the real ones check the same things in C++


def _check_inputs(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor):
    for name, t in (("x", x), ("w_up", w_up), ("w_down", w_down)) + ((("w_gate", w_gate),) if w_gate is not None else ()):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"twblas: {name} has dtype {t.dtype}; float32, float16 or bfloat16 expected")
        if t.device != x.device:
            raise ValueError(f"twblas: {name} is on {t.device}, x on {x.device}: all on one device")
        if t.dtype != x.dtype:
            raise ValueError(f"twblas: {name} has dtype {t.dtype}, x {x.dtype}: one dtype for all")
    if x.dim() < 1:
        raise ValueError("twblas: x must have shape (..., D)")
    if w_up.dim() != 2 or w_down.dim() != 2:
        raise ValueError("twblas: w_up must be (H, D) and w_down (D, H)")


def _down_in_place(w: Tensor) -> bool:
    """w_down (D, H) with strides (1, >= D): the layout the CUDA kernels read in place (the C
    kernels' rule, csrc/twblas_torch.cpp down_in_place)."""
    d, h = w.shape
    return (d <= 1 or w.stride(0) == 1) and (h <= 1 or w.stride(1) >= max(d, 1))


@torch.library.register_fake("twblas::ffn_forward")
def _(x, w_gate, w_up, w_down, training, save_dense):
    _check_inputs(x, w_gate, w_up, w_down)
    # the saved state's length depends on the backend and the sizes: a dynamic size
    saved_len = torch.library.get_ctx().new_dynamic_size() if training else 0
    return (x.new_empty(x.shape), x.new_empty((), dtype=torch.float32),
            x.new_empty(saved_len, dtype=torch.uint8))


@torch.library.register_fake("twblas::ffn_backward")
def _(x, w_gate, w_up, w_down, saved, dy, dl1):
    _check_inputs(x, w_gate, w_up, w_down)
    h, d = w_up.shape
    dwd = x.new_empty_strided((d, h), (1, d)) if _down_in_place(w_down) else x.new_empty((d, h))
    return x.new_empty(x.shape), x.new_empty((2 * h if w_gate is not None else h, d)), dwd


# ---------------------------------------------------------------------------------------------
# the public interface


def sparse_ffn(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor,
               save_dense: Optional[bool] = None) -> Tuple[Tensor, Tensor]:
    """y = (ReLU(x w_gate^T) * (x w_up^T)) w_down^T, or ReLU(x w_up^T) w_down^T with w_gate None;
    and l1 = mean over tokens of sum_j |h_tj|. Differentiable in x, every weight and through l1.

    A training step in dense mode (CUDA, 16-bit: activations too dense for the sparse path, as at
    the start of training) keeps g and u of every token for the backward (4 bytes x tokens x H
    for bf16, held until the backward), so that it runs at the dense step's speed; sparse steps
    keep only the active units'. save_dense: None (the default) lets the library choose so;
    True reserves that room in every step, dense mode or not (TW_SAVE_DENSE_ALWAYS); False never
    keeps them, the least memory (TW_SAVE_DENSE_NEVER: a dense-mode step recomputes g and u, two
    GEMMs more). Results are the same either way."""
    if torch.compiler.is_compiling():
        # traced: ffn_forward (fake kernel above, autograd from C++) with `training` decided here
        training = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, w_gate, w_up, w_down))
        y, l1, _ = _ffn_forward(x, w_gate, w_up, w_down, training, save_dense)
        return y, l1
    return _sparse_ffn_op(x, w_gate, w_up, w_down, save_dense)


def down_weight_in_place_layout(weight: Tensor) -> Tensor:
    """Re-lays a down_proj.weight (D, H) so that its storage is H x D row-major (strides
    (1, D)): the layout twblas's CUDA kernels read in place. The tensor (a Parameter) stays the
    same object with the same shape and values; only its storage changes (`weight.data = ...`),
    so modules and optimizers holding it keep working. Returns `weight`; nothing happens when it
    is in that layout already."""
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError("twblas: down_weight_in_place_layout needs a 2-D (D, H) tensor")
    if not _down_in_place(weight):
        with torch.no_grad():
            weight.data = weight.data.t().contiguous().t()
    return weight


def _stacked(gate: Tensor, up: Tensor) -> bool:
    return (gate.is_contiguous() and up.is_contiguous() and gate.shape == up.shape and gate.dtype == up.dtype
            and gate.device == up.device and up.untyped_storage().data_ptr() == gate.untyped_storage().data_ptr()
            and up.data_ptr() == gate.data_ptr() + gate.numel() * gate.element_size())


def gate_up_stacked_layout(gate_weight: Tensor, up_weight: Tensor) -> None:
    """Re-lays a gated MLP's gate_proj.weight and up_proj.weight (H, D each) into one storage,
    up's rows right after gate's (a stacked [Wg; Wu], as fused gate-up weights are stored): the
    training backward then computes dX and [dWg; dWu] as one GEMM each, as the dense step does.
    Both tensors (Parameters) stay the same objects with the same shapes and values; only their
    storage changes (`weight.data = ...`). Nothing happens when they are stacked already. Moving
    a module (`.to(device)`, `.to(dtype)`) gives each weight its own storage again: re-lay after."""
    if not all(isinstance(w, Tensor) and w.dim() == 2 for w in (gate_weight, up_weight)):
        raise ValueError("twblas: gate_up_stacked_layout needs two 2-D (H, D) tensors")
    if gate_weight.shape != up_weight.shape or gate_weight.dtype != up_weight.dtype or \
            gate_weight.device != up_weight.device:
        raise ValueError("twblas: gate_up_stacked_layout needs weights of one shape, dtype and device")
    if _stacked(gate_weight, up_weight) or gate_weight.device.type == "meta":
        return
    with torch.no_grad():
        both = torch.cat([gate_weight.data, up_weight.data])
        h = gate_weight.shape[0]
        gate_weight.data, up_weight.data = both[:h], both[h:]


class SparseMLP(torch.nn.Module):
    """A LLaMA-style MLP (gate_proj, up_proj, down_proj without bias) on twblas's sparse FFN.

    forward(x) -> y; the last forward's l1 is `.l1`; `.stats()` gives the last forward's tokens,
    mean_active, max_active and overflow_rows. A LLaMA MLP's state_dict loads as it is.
    down_proj.weight is kept in the layout the kernels read in place (down_weight_in_place_layout),
    gate_proj.weight and up_proj.weight in one storage (gate_up_stacked_layout)."""

    def __init__(self, d_model: int, d_ff: int, gated: bool = True, device=None, dtype=None,
                 save_dense: Optional[bool] = None):
        super().__init__()
        self.save_dense = save_dense  # see sparse_ffn
        kw = {"device": device, "dtype": dtype}
        self.gated = gated
        self.gate_proj = torch.nn.Linear(d_model, d_ff, bias=False, **kw) if gated else None
        self.up_proj = torch.nn.Linear(d_model, d_ff, bias=False, **kw)
        self.down_proj = torch.nn.Linear(d_ff, d_model, bias=False, **kw)
        down_weight_in_place_layout(self.down_proj.weight)
        if gated:
            gate_up_stacked_layout(self.gate_proj.weight, self.up_proj.weight)
        self.l1 = None

    def _weights(self):
        return (self.gate_proj.weight if self.gated else None), self.up_proj.weight, self.down_proj.weight

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            y, self.l1 = sparse_ffn(x, *self._weights(), save_dense=self.save_dense)
            return y
        # eager: the op straight away, and l1 stored without nn.Module.__setattr__'s checks (it
        # is a plain attribute: __init__ set it to None)
        y, l1 = _sparse_ffn_op(x, self.gate_proj.weight if self.gated else None, self.up_proj.weight,
                               self.down_proj.weight, self.save_dense)
        self.__dict__["l1"] = l1
        return y

    @torch.compiler.disable
    def stats(self) -> dict:
        """The last forward's activation statistics (twFfnGetStats: synchronises)."""
        tokens, mean, most, overflow, _ = torch.ops.twblas.ffn_stats(*self._weights())
        return {"tokens": int(tokens), "mean_active": float(mean), "max_active": int(most),
                "overflow_rows": int(overflow)}

    @torch.compiler.disable
    def neuron_counts(self, reset: bool = False) -> Tensor:
        """How many tokens each hidden unit was active for (its gate above zero), summed over the
        forwards since the last reset: an int64 tensor of d_ff values on the weights' device,
        written in stream order (reading it orders after the forwards). Dead units read 0; units
        active on most tokens show up too (they set the backward's longest per-unit sums).
        `reset`: start counting again after reading."""
        return torch.ops.twblas.ffn_neuron_counts(*self._weights(), reset)

    @classmethod
    def from_dense(cls, module: torch.nn.Module) -> "SparseMLP":
        """A SparseMLP over the weights of any module that has up_proj and down_proj (nn.Linear,
        no bias) and, for the gated form, gate_proj. The Parameters are shared, not copied: the
        module and the SparseMLP hold the same Parameter objects. down_proj.weight's storage is
        re-laid into the in-place layout (down_weight_in_place_layout), and gate_proj's and
        up_proj's into one (gate_up_stacked_layout), which the dense module computes with as
        before."""
        up, down = getattr(module, "up_proj", None), getattr(module, "down_proj", None)
        gate = getattr(module, "gate_proj", None)
        for name, lin in (("up_proj", up), ("down_proj", down)) + ((("gate_proj", gate),) if gate is not None else ()):
            if not isinstance(lin, torch.nn.Linear) or lin.bias is not None:
                raise ValueError(f"twblas: {name} must be an nn.Linear without bias")
        out = cls(up.in_features, up.out_features, gated=gate is not None, device="meta", dtype=up.weight.dtype)
        down_weight_in_place_layout(down.weight)
        if gate is not None:
            gate_up_stacked_layout(gate.weight, up.weight)
        out.up_proj.weight = up.weight
        out.down_proj.weight = down.weight
        if gate is not None:
            out.gate_proj.weight = gate.weight
        return out

