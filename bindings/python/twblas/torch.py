"""twblas inside PyTorch: the sparse FFN as a custom op (autograd, torch.compile) and a module.

    y, l1 = sparse_ffn(x, w_gate, w_up, w_down)
    mlp = SparseMLP(d_model, d_ff, gated=True)

Weights use nn.Linear's layouts: w_gate, w_up (H, D) (gate_proj.weight, up_proj.weight), w_down
(D, H) (down_proj.weight). x is (..., D), in the weights' dtype (fp32, fp16 or bf16), on the CPU
or a CUDA device; y has x's shape and dtype. l1 is a 0-dim fp32 tensor: the mean over tokens of
sum_j |h_tj|, the paper's regulariser (the caller adds coefficient * l1 to its loss; its gradient
becomes the C API's l1Coeff).

How it runs: one twblas handle per device and thread, on torch's current CUDA stream; workspaces
and the saved state come from torch's allocator. The C library keeps a packed copy of the weights
(an FFN descriptor) per weight set, shared by every thread: autograd runs a CUDA backward on a
thread of its own, and that backward must see what its forward told the descriptor (dense mode,
z and u kept), or it recomputes every row. Calls on one descriptor are serialised by its lock
(they set its pointer attributes per call). It is refreshed (twFfnUpdateWeights, ordered on
torch's current stream, no host wait) when a weight tensor's version changes, so an optimizer step
needs nothing from the user.
Per call the binding reuses what it can: dense descriptors (a per-thread cache keyed by address,
shape and type), _bufferSize answers (memoised per FFN descriptor), and eager inference skips
PyTorch's op dispatcher (autograd and torch.compile go through the custom op).
Nothing is read back per call: the forward writes l1 straight into its tensor
(TW_FFN_ATTR_L1_OUTPUT) and the backward reads l1's gradient from its tensor
(TW_FFN_ATTR_L1_COEFF_POINTER), both in stream order. SparseMLP.stats() reads the statistics
with twFfnGetStats, which synchronises.
"""

import collections
import contextlib
import ctypes
import threading
import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib as C

__all__ = ["sparse_ffn", "SparseMLP"]

_DTYPES = {torch.float32: C.R_32F, torch.float16: C.R_16F, torch.bfloat16: C.R_16BF}
# the current stream's address without a torch.cuda.Stream object (a few microseconds a call
# fewer); torch.cuda.current_stream where this torch lacks it
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

# ---------------------------------------------------------------------------------------------
# handles and descriptors (C objects owned by Python objects)


class _Owned:
    """A C object owned by a Python object: `ptr`, freed by the C function named `_destroy`."""

    _destroy = ""

    def __init__(self):
        self.ptr = ctypes.c_void_p()

    def __del__(self):
        try:  # at interpreter exit the module's globals may already be gone: nothing to free then
            if self.ptr:
                getattr(C.lib(), self._destroy)(self.ptr)
        except Exception:  # noqa: BLE001
            pass


class _Handle(_Owned):
    """A twblas handle for one device, used by one thread (the C API's rule)."""

    _destroy = "twDestroy"

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"twblas: tensors on {device} are not supported (CPU or CUDA)")
        self.index = (device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else -1
        self.stream = None  # the stream last given to twSetStream
        backend = C.BACKEND_CUDA if device.type == "cuda" else C.BACKEND_CPU
        # a CUDA handle belongs to the device current at its creation
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            C.check(C.lib().twCreateWithBackend(ctypes.byref(self.ptr), backend), None, "twCreateWithBackend")

    def on_current_stream(self):
        """The handle, set to torch's current stream of its device (twSetStream only when that
        stream changed: the handle is this thread's own, and only this method sets its stream)."""
        if self.device.type == "cuda":
            stream = (_raw_stream(self.index) if _raw_stream is not None
                      else torch.cuda.current_stream(self.device).cuda_stream)
            if stream != self.stream:
                C.check(C.lib().twSetStream(self.ptr, ctypes.c_void_p(stream)), self.ptr, "twSetStream")
                self.stream = stream
        return self.ptr



class _DnMat(_Owned):
    """A dense descriptor over a tensor's memory (kept alive while the descriptor is)."""

    _destroy = "twDestroyDnMat"

    def __init__(self, t: Optional[Tensor], rows: int, cols: int, ld: int, order: int,
                 data: Optional[int] = None, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.tensor = t
        if t is not None:
            data, dtype = (t.data_ptr() if t.numel() > 0 else None), t.dtype
        C.check(C.lib().twCreateDnMat(ctypes.byref(self.ptr), rows, cols, ld, ctypes.c_void_p(data), _DTYPES[dtype],
                                      order), None, "twCreateDnMat")

    @staticmethod
    def _layout_rows(t: Tensor):
        return t.shape[0], t.shape[1], max(1, t.stride(0)) if t.shape[0] > 0 else max(1, t.shape[1]), C.ORDER_ROW

    @staticmethod
    def _layout_down(t: Tensor):
        d, h = t.shape
        return h, d, max(1, t.stride(0)), C.ORDER_COL

    @staticmethod
    def rows_of(t: Tensor) -> "_DnMat":
        """A row-major (M, N) tensor with unit column stride."""
        return _DnMat(t, *_DnMat._layout_rows(t))

    @staticmethod
    def down_of(t: Tensor) -> "_DnMat":
        """nn.Linear's down_proj.weight (D, H) row-major: the C API's H x D column-major Wd."""
        return _DnMat(t, *_DnMat._layout_down(t))


def _described(t: Tensor, down: bool = False) -> int:
    """The address of a dense descriptor of `t` (rows_of, or down_of with `down`) for one call,
    from this thread's cache: a descriptor is only an address, a shape and a type (it holds no
    tensor), so one made for earlier memory at the same address serves again (twCreateDnMat and
    twDestroyDnMat cost ~5 us a pair through ctypes, and a call needs up to seven)."""
    rows, cols, ld, order = _DnMat._layout_down(t) if down else _DnMat._layout_rows(t)
    data = t.data_ptr() if t.numel() > 0 else None
    key = (data, rows, cols, ld, order, t.dtype)
    cache = _state.descriptors
    d = cache.get(key)
    if d is None:
        d = cache[key] = _DnMat(None, rows, cols, ld, order, data=data, dtype=t.dtype)
        if len(cache) > _MAX_DESCRIPTORS:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return d.ptr



class _Ffn(_Owned):
    """The C library's FFN descriptor for one weight set on one device and thread."""

    _destroy = "twDestroyFfn"

    def __init__(self, handle: _Handle, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor):
        super().__init__()
        # held around every use (its attributes are set per call); a thread of the same call may re-enter
        self.lock = threading.RLock()
        self.refs = [weakref.ref(w) if w is not None else None for w in (w_gate, w_up, w_down)]
        self.versions = self._versions(w_gate, w_up, w_down)
        self.gated = w_gate is not None
        self.descr = [_DnMat.rows_of(w_gate) if self.gated else None, _DnMat.rows_of(w_up), _DnMat.down_of(w_down)]
        kind = C.FFN_GATED_RELU if self.gated else C.FFN_RELU
        h = handle.on_current_stream()
        C.check(C.lib().twCreateFfn(h, ctypes.byref(self.ptr), kind, self._p(0), self._p(1), self._p(2)), h,
                "twCreateFfn")
        self.stats = C.FfnStats()
        self.save_dense = False  # TW_FFN_ATTR_SAVE_DENSE as last set
        self.sizes = {}  # memoised _bufferSize answers (sized)
        self.pointers = {}  # pointer attribute -> the address last set (point)

    def sized(self, key, query) -> int:
        """A _bufferSize answer, memoised by `key`: everything it depends on (the call, the token
        count, the layouts, the attributes)."""
        n = self.sizes.get(key)
        if n is None:
            if len(self.sizes) >= 1024:  # serving sees many token counts
                self.sizes.clear()
            n = self.sizes[key] = query()
        return n

    def set_save_dense(self, on: bool):
        if on != self.save_dense:
            flag = ctypes.c_int32(1 if on else 0)
            C.check(C.lib().twFfnSetAttribute(self.ptr, C.FFN_ATTR_SAVE_DENSE, ctypes.byref(flag), 4), None,
                    "twFfnSetAttribute")
            self.save_dense = on

    def _p(self, i):
        return self.descr[i].ptr if self.descr[i] is not None else None

    @staticmethod
    def _versions(*ws):
        return tuple(w._version if w is not None else -1 for w in ws)

    def matches(self, ws) -> bool:
        return all((r is None and w is None) or (r is not None and r() is w) for r, w in zip(self.refs, ws))

    def sync_weights(self, handle: _Handle, ws):
        """Re-reads the weights when a tensor changed in place since the last call."""
        v = self._versions(*ws)
        if v != self.versions:
            h = handle.on_current_stream()
            C.check(C.lib().twFfnUpdateWeights(h, self.ptr, self._p(0), self._p(1), self._p(2)), h,
                    "twFfnUpdateWeights")
            self.versions = v

    def point(self, attr: int, t: Tensor):
        """The pointer attribute `attr` (TW_FFN_ATTR_L1_OUTPUT / _L1_COEFF_POINTER) at the fp32
        scalar `t` for the next call. It stays set afterwards (one ctypes call fewer per call, none
        when the caching allocator hands out the same address again): every call of this module
        that reads or writes it sets it first, under the FFN's lock, so a stale address is never
        used."""
        address = t.data_ptr()
        if self.pointers.get(attr) != address:
            p = ctypes.c_void_p(address)
            C.check(C.lib().twFfnSetAttribute(self.ptr, attr, ctypes.byref(p), ctypes.sizeof(p)), None,
                    "twFfnSetAttribute")
            self.pointers[attr] = address

    def read_stats(self, handle: _Handle) -> C.FfnStats:
        h = handle.on_current_stream()
        C.check(C.lib().twFfnGetStats(h, self.ptr, ctypes.byref(self.stats)), h, "twFfnGetStats")
        return self.stats



class _ThreadState(threading.local):
    def __init__(self):
        self.handles = {}  # device -> _Handle (the C API: a handle is used by one thread at a time)
        # (address, rows, cols, ld, order, dtype) -> _DnMat without a tensor, least recently used
        # first; per thread, so that no other thread destroys one while a call reads it
        self.descriptors = collections.OrderedDict()


_state = _ThreadState()
# FFN descriptors, shared by all threads: (device, weight identities) -> _Ffn
_ffns = {}
_ffns_lock = threading.Lock()
_MAX_FFNS = 64  # FFN descriptors kept (each holds a packed copy of its weights)
_MAX_DESCRIPTORS = 256  # dense descriptors kept per thread


def _handle(device: torch.device) -> _Handle:
    key = (device.type, device.index if device.type == "cuda" else None)
    h = _state.handles.get(key)
    if h is None:
        h = _state.handles[key] = _Handle(torch.device(device.type, key[1]) if key[1] is not None else device)
    return h


@contextlib.contextmanager
def _using_ffn(handle: _Handle, ws):
    """The FFN descriptor of weights `ws`, locked and with the weights' current values, for the
    calls inside."""
    key = (str(handle.device),) + tuple(
        (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype) if w is not None else None for w in ws)
    with _ffns_lock:
        f = _ffns.get(key)
        if f is not None and not f.matches(ws):
            f = None  # the memory of freed weights, reused by other tensors
        fresh = f is None
        if fresh:
            if len(_ffns) >= _MAX_FFNS:  # one still in use elsewhere lives on until that use ends
                _ffns.pop(next(iter(_ffns)))
            f = _ffns[key] = _Ffn(handle, *ws)
    with f.lock:
        if not fresh:
            f.sync_weights(handle, ws)
        yield f


def _workspace(nbytes: int, device) -> Tensor:
    # torch's allocators align to 256 bytes on CUDA and 64 on the CPU (the C API needs 256 / 16)
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


# ---------------------------------------------------------------------------------------------
# checks (ValueError before anything reaches the C library where Python can tell)


def _check_inputs(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor):
    for name, t in (("x", x), ("w_up", w_up), ("w_down", w_down)) + ((("w_gate", w_gate),) if w_gate is not None else ()):
        if not isinstance(t, Tensor):
            raise ValueError(f"twblas: {name} must be a tensor")
        if t.dtype not in _DTYPES:
            raise ValueError(f"twblas: {name} has dtype {t.dtype}; float32, float16 or bfloat16 expected")
        if t.device != x.device:
            raise ValueError(f"twblas: {name} is on {t.device}, x on {x.device}: all on one device")
        if t.dtype != x.dtype:
            raise ValueError(f"twblas: {name} has dtype {t.dtype}, x {x.dtype}: one dtype for all")
    if x.dim() < 1:
        raise ValueError("twblas: x must have shape (..., D)")
    if w_up.dim() != 2 or w_down.dim() != 2:
        raise ValueError("twblas: w_up must be (H, D) and w_down (D, H)")
    h, d = w_up.shape
    if x.shape[-1] != d:
        raise ValueError(f"twblas: x has D = {x.shape[-1]}, w_up is (H, D) = {tuple(w_up.shape)}")
    if tuple(w_down.shape) != (d, h):
        raise ValueError(f"twblas: w_down must be (D, H) = {(d, h)}, got {tuple(w_down.shape)}")
    if w_gate is not None and tuple(w_gate.shape) != (h, d):
        raise ValueError(f"twblas: w_gate must be (H, D) = {(h, d)}, got {tuple(w_gate.shape)}")


def _weights(w_gate, w_up, w_down):
    # the C API reads rows with unit stride; nn.Linear weights are contiguous already
    return tuple(w.contiguous() if w is not None else None for w in (w_gate, w_up, w_down))


# ---------------------------------------------------------------------------------------------
# the custom ops


def _forward_impl(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor,
                  training: bool, save_dense: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(y, l1, saved): saved is the C API's saved state (bytes) when `training`, else empty;
    `save_dense` sets TW_FFN_ATTR_SAVE_DENSE before it is sized."""
    handle = _handle(x.device)
    ws = _weights(w_gate, w_up, w_down)
    y = torch.empty_like(x)
    with _using_ffn(handle, ws) as ffn:  # made (weights checked) on the first call, even of no tokens
        if x.shape[0] == 0:
            return y, torch.zeros((), dtype=torch.float32, device=x.device), torch.empty(0, dtype=torch.uint8, device=x.device)
        l1 = torch.empty((), dtype=torch.float32, device=x.device)  # written by the forward, in stream order
        saved = _forward_call(handle, ffn, x, y, l1, training, save_dense)
    return y, l1, saved


def _forward_call(handle: _Handle, ffn: _Ffn, x: Tensor, y: Tensor, l1: Tensor, training: bool,
                  save_dense: bool) -> Tensor:
    """The forward's C calls, with ffn's lock held; returns the saved state (empty unless training)."""
    m = x.shape[0]
    saved = torch.empty(0, dtype=torch.uint8, device=x.device)
    h = handle.on_current_stream()
    xd, yd = _described(x), _described(y)
    if training:
        ffn.set_save_dense(save_dense)

    def query(fn, *args):
        n = ctypes.c_size_t()
        C.check(getattr(C.lib(), fn)(h, ffn.ptr, *args, ctypes.byref(n)), h, fn)
        return n.value

    work = _workspace(ffn.sized(("forward", m, x.stride(0), y.stride(0), ffn.save_dense),
                                lambda: query("twSpGEMMFused_bufferSize", xd, yd)), x.device)
    ffn.point(C.FFN_ATTR_L1_OUTPUT, l1)
    if training:
        saved = _workspace(ffn.sized(("saved", m, ffn.save_dense), lambda: query("twSpGEMMFusedSaved_bufferSize", m)),
                           x.device)
        C.check(C.lib().twSpGEMMFusedForwardTrain(h, ffn.ptr, xd, yd, ctypes.c_void_p(saved.data_ptr()),
                                                  ctypes.c_void_p(work.data_ptr())), h, "twSpGEMMFusedForwardTrain")
    else:
        C.check(C.lib().twSpGEMMFused(h, ffn.ptr, xd, yd, None, ctypes.c_void_p(work.data_ptr())), h,
                "twSpGEMMFused")
    return saved


_ffn_forward = torch.library.custom_op("twblas::ffn_forward", mutates_args=())(_forward_impl)


@_ffn_forward.register_fake
def _(x, w_gate, w_up, w_down, training, save_dense):
    saved_len = torch.library.get_ctx().new_dynamic_size() if training else 0
    return (torch.empty_like(x), x.new_empty((), dtype=torch.float32),
            x.new_empty(saved_len, dtype=torch.uint8))


def _backward_impl(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor, saved: Tensor, dy: Tensor,
                   dl1: Tensor) -> List[Tensor]:
    """[dx, dw_up, dw_down, dw_gate (empty for a plain FFN)]; dl1, l1's incoming gradient, is the
    C API's l1Coeff, which the backward's kernels read from the tensor (no read-back)."""
    if saved.numel() == 0 and x.shape[0] > 0:
        raise RuntimeError("twblas: the forward ran without gradients enabled: no saved state to differentiate")
    if dl1.device != x.device or dl1.numel() != 1:
        raise ValueError(f"twblas: l1's gradient must be one value on {x.device}, got shape {tuple(dl1.shape)} on {dl1.device}")
    coeff = dl1.reshape(())
    if coeff.dtype != torch.float32:
        coeff = coeff.to(torch.float32)
    handle = _handle(x.device)
    ws = _weights(w_gate, w_up, w_down)
    dy = dy.contiguous()
    dx = torch.empty_like(x)
    dwu, dwd = torch.empty_like(w_up), torch.empty_like(w_down)
    dwg = torch.empty_like(w_gate) if w_gate is not None else torch.empty(0, dtype=x.dtype, device=x.device)
    m = x.shape[0]
    xd, dyd, dxd = _described(x), _described(dy), _described(dx)
    dwgd = _described(dwg) if w_gate is not None else None
    dwud, dwdd = _described(dwu), _described(dwd, down=True)
    # the forward's descriptor, also when autograd runs this on a thread of its own
    with _using_ffn(handle, ws) as ffn:
        h = handle.on_current_stream()

        def query():
            n = ctypes.c_size_t()
            C.check(C.lib().twSpGEMMFusedBackward_bufferSize(h, ffn.ptr, m, ctypes.byref(n)), h,
                    "twSpGEMMFusedBackward_bufferSize")
            return n.value

        work = _workspace(ffn.sized(("backward", m, ffn.save_dense), query), x.device)
        ffn.point(C.FFN_ATTR_L1_COEFF_POINTER, coeff)  # the l1Coeff argument (0) is then ignored
        C.check(C.lib().twSpGEMMFusedBackward(h, ffn.ptr, xd, ctypes.c_void_p(saved.data_ptr() if m else None),
                                              dyd, 0.0, dxd, dwgd, dwud,
                                              dwdd, ctypes.c_void_p(work.data_ptr())), h,
                "twSpGEMMFusedBackward")
    return [dx, dwu, dwd, dwg]


_ffn_backward = torch.library.custom_op("twblas::ffn_backward", mutates_args=())(_backward_impl)


@_ffn_backward.register_fake
def _(x, w_gate, w_up, w_down, saved, dy, dl1):
    dwg = torch.empty_like(w_gate) if w_gate is not None else x.new_empty(0)
    return [torch.empty_like(x), torch.empty_like(w_up), torch.empty_like(w_down), dwg]


def _setup_context(ctx, inputs, output):
    x, w_gate, w_up, w_down, training, save_dense = inputs
    _, _, saved = output
    ctx.gated = w_gate is not None
    ctx.save_for_backward(x, w_gate, w_up, w_down, saved)


def _gradients(ctx, dy, dl1, backward):
    """(dx, dw_gate or None, dw_up, dw_down) from the saved tensors, through `backward` (the
    custom op, or its implementation in eager training)."""
    x, w_gate, w_up, w_down, saved = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    if dl1 is None:
        dl1 = x.new_zeros((), dtype=torch.float32)
    dx, dwu, dwd, dwg = backward(x, w_gate, w_up, w_down, saved, dy, dl1)
    return dx, (dwg if ctx.gated else None), dwu, dwd


def _backward(ctx, dy, dl1, dsaved):
    return _gradients(ctx, dy, dl1, _ffn_backward) + (None, None)


torch.library.register_autograd("twblas::ffn_forward", _backward, setup_context=_setup_context)


class _EagerTraining(torch.autograd.Function):
    """The custom ops' forward and backward for eager training, without the op dispatcher (the
    custom op and its autograd registration stay for torch.compile): the dispatcher's schema and
    autograd glue cost more host time per layer than the C calls, and a small model's training
    step is host-bound (docs/pytorch/README.md). Same implementations, so the same bits."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, save_dense):
        y, l1, saved = _forward_impl(x, w_gate, w_up, w_down, True, save_dense)
        _setup_context(ctx, (x, w_gate, w_up, w_down, True, save_dense), (y, l1, saved))
        return y, l1

    @staticmethod
    def backward(ctx, dy, dl1):
        return _gradients(ctx, dy, dl1, _backward_impl) + (None,)


# ---------------------------------------------------------------------------------------------
# the public interface


def _eager(*tensors) -> bool:
    """Plain tensors outside torch.compile (no fake or functional tensors, no other subclass)."""
    return not torch.compiler.is_compiling() and all(
        t is None or type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors)


def sparse_ffn(x: Tensor, w_gate: Optional[Tensor], w_up: Tensor, w_down: Tensor,
               save_dense: bool = False) -> Tuple[Tensor, Tensor]:
    """y = (ReLU(x w_gate^T) * (x w_up^T)) w_down^T, or ReLU(x w_up^T) w_down^T with w_gate None;
    and l1 = mean over tokens of sum_j |h_tj|. Differentiable in x, every weight and through l1.

    save_dense (CUDA, 16-bit): when a training step runs in dense mode (activations too dense
    for the sparse path, as at the start of training), keep g and u of every token for the
    backward (4 bytes x tokens x H more for bf16, held until the backward) so that the step
    runs at the dense step's speed instead of recomputing them. Results are the same."""
    _check_inputs(x, w_gate, w_up, w_down)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    training = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, w_gate, w_up, w_down))
    if not training and _eager(x2, w_gate, w_up, w_down):
        # eager inference needs neither autograd nor tracing: the op's implementation without the
        # dispatcher, which costs more host time than the C call at a few tokens
        y, l1, _ = _forward_impl(x2, w_gate, w_up, w_down, False, save_dense)
    elif training and _eager(x2, w_gate, w_up, w_down):
        y, l1 = _EagerTraining.apply(x2, w_gate, w_up, w_down, save_dense)
    else:
        y, l1, _ = _ffn_forward(x2, w_gate, w_up, w_down, training, save_dense)
    return y.reshape(shape), l1


class SparseMLP(torch.nn.Module):
    """A LLaMA-style MLP (gate_proj, up_proj, down_proj without bias) on twblas's sparse FFN.

    forward(x) -> y; the last forward's l1 is `.l1`; `.stats()` gives the last forward's tokens,
    mean_active, max_active and overflow_rows. A LLaMA MLP's state_dict loads as it is."""

    def __init__(self, d_model: int, d_ff: int, gated: bool = True, device=None, dtype=None,
                 save_dense: bool = False):
        super().__init__()
        self.save_dense = save_dense  # see sparse_ffn
        kw = {"device": device, "dtype": dtype}
        self.gated = gated
        self.gate_proj = torch.nn.Linear(d_model, d_ff, bias=False, **kw) if gated else None
        self.up_proj = torch.nn.Linear(d_model, d_ff, bias=False, **kw)
        self.down_proj = torch.nn.Linear(d_ff, d_model, bias=False, **kw)
        self.l1 = None

    def forward(self, x: Tensor) -> Tensor:
        y, l1 = sparse_ffn(x, self.gate_proj.weight if self.gated else None, self.up_proj.weight,
                           self.down_proj.weight, save_dense=self.save_dense)
        self.l1 = l1
        return y

    def stats(self) -> dict:
        ws = _weights(self.gate_proj.weight if self.gated else None, self.up_proj.weight, self.down_proj.weight)
        handle = _handle(self.up_proj.weight.device)
        with _using_ffn(handle, ws) as ffn:
            s = ffn.read_stats(handle)
        return {"tokens": int(s.tokens), "mean_active": float(s.meanRowNnz), "max_active": int(s.maxRowNnz),
                "overflow_rows": int(s.overflowRows)}

    def neuron_counts(self, reset: bool = False) -> Tensor:
        """How many tokens each hidden unit was active for (its gate above zero), summed over the
        forwards since the last reset: an int64 tensor of d_ff values on the weights' device. Dead
        units read 0; units active on most tokens show up too (they set the backward's longest
        per-unit sums). Synchronises. `reset`: start counting again after reading."""
        ws = _weights(self.gate_proj.weight if self.gated else None, self.up_proj.weight, self.down_proj.weight)
        device = self.up_proj.weight.device
        counts = torch.empty(self.up_proj.weight.shape[0], dtype=torch.int64, device=device)
        handle = _handle(device)
        with _using_ffn(handle, ws) as ffn:
            h = handle.on_current_stream()
            C.check(C.lib().twFfnGetNeuronCounts(h, ffn.ptr, ctypes.c_void_p(counts.data_ptr())), h,
                    "twFfnGetNeuronCounts")
            if reset:
                C.check(C.lib().twFfnResetNeuronCounts(h, ffn.ptr), h, "twFfnResetNeuronCounts")
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return counts

    @classmethod
    def from_dense(cls, module: torch.nn.Module) -> "SparseMLP":
        """A SparseMLP with the weights of any module that has up_proj and down_proj (nn.Linear,
        no bias) and, for the gated form, gate_proj."""
        up, down = getattr(module, "up_proj", None), getattr(module, "down_proj", None)
        gate = getattr(module, "gate_proj", None)
        for name, lin in (("up_proj", up), ("down_proj", down)) + ((("gate_proj", gate),) if gate is not None else ()):
            if not isinstance(lin, torch.nn.Linear) or lin.bias is not None:
                raise ValueError(f"twblas: {name} must be an nn.Linear without bias")
        w = up.weight
        out = cls(up.in_features, up.out_features, gated=gate is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            out.up_proj.weight.copy_(up.weight)
            out.down_proj.weight.copy_(down.weight)
            if gate is not None:
                out.gate_proj.weight.copy_(gate.weight)
        return out
