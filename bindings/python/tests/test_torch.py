"""twblas.torch against dense PyTorch: forward, gradients, l1, the module, compile, bad input.

Runs on the CPU backend everywhere, and on CUDA too where torch sees a GPU and libtwblas was
built with the CUDA backend.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import twblas.torch as twblas_torch
from twblas.torch import SparseMLP, sparse_ffn


from _support import cuda_usable as _cuda_usable  # noqa: E402


DEVICES = ["cpu"] + (["cuda"] if _cuda_usable() else [])


class DenseMLP(torch.nn.Module):
    """The dense LLaMA-style MLP twblas must match."""

    def __init__(self, d, h, gated, dtype=torch.float32, device="cpu"):
        super().__init__()
        kw = {"dtype": dtype, "device": device, "bias": False}
        self.gate_proj = torch.nn.Linear(d, h, **kw) if gated else None
        self.up_proj = torch.nn.Linear(d, h, **kw)
        self.down_proj = torch.nn.Linear(h, d, **kw)

    def hidden(self, x):
        if self.gate_proj is None:
            return torch.relu(self.up_proj(x))
        return torch.relu(self.gate_proj(x)) * self.up_proj(x)

    def forward(self, x):
        h = self.hidden(x)
        return self.down_proj(h), h.float().abs().sum(-1).mean()


def _weights(dense):
    g = dense.gate_proj.weight if dense.gate_proj is not None else None
    return g, dense.up_proj.weight, dense.down_proj.weight


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)])
@pytest.mark.parametrize("shape", [(37,), (3, 5), (2, 3, 4)])
def test_forward_and_gradients_match_dense(device, gated, dtype, tol, shape):
    torch.manual_seed(len(shape) * 10 + gated)
    d, h = 29, 101  # off every tile multiple
    dense = DenseMLP(d, h, gated, dtype, device)
    x = torch.randn(*shape, d, dtype=dtype, device=device, requires_grad=True)
    y, l1 = sparse_ffn(x, *_weights(dense))
    assert y.shape == x.shape and y.dtype == dtype and l1.dtype == torch.float32 and l1.dim() == 0
    yr, l1r = dense(x)
    assert _rel(y, yr) < tol
    assert abs(l1.item() - l1r.item()) <= tol * max(1.0, abs(l1r.item()))

    dy = torch.randn_like(y)
    coeff = 0.3
    (y * dy).sum().add(coeff * l1).backward()
    grads = [t.grad.clone() for t in (x,) + tuple(p for p in _weights(dense) if p is not None)]
    for t in (x,) + tuple(p for p in _weights(dense) if p is not None):
        t.grad = None
    yr, l1r = dense(x)
    (yr * dy).sum().add(coeff * l1r).backward()
    for got, t in zip(grads, (x,) + tuple(p for p in _weights(dense) if p is not None)):
        assert got.shape == t.grad.shape and got.dtype == t.grad.dtype
        assert _rel(got, t.grad) < 5 * tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("save_dense", [None, True, False])
def test_save_dense_steps_match_dense(device, gated, save_dense):
    # dense activations (about half the units fire): after the first step the CUDA backend runs
    # the step in dense mode and its backward from the kept g and u (None: the library's choice,
    # True: always room for them) or, with False, from g and u recomputed
    torch.manual_seed(5 + gated)
    dtype, tol = (torch.bfloat16, 2e-2) if device == "cuda" else (torch.float32, 1e-5)
    dense = DenseMLP(64, 256, gated, dtype, device)
    mlp = SparseMLP(64, 256, gated=gated, device=device, dtype=dtype, save_dense=save_dense)
    mlp.load_state_dict(dense.state_dict())
    x = torch.randn(300, 64, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(300, 64, dtype=dtype, device=device)
    for _ in range(2):
        for t in (x,) + tuple(mlp.parameters()):
            t.grad = None
        (mlp(x) * dy).sum().add(0.1 * mlp.l1).backward()
    assert mlp.stats()["mean_active"] > 64
    # gated: gate_proj's and up_proj's weights share one storage (SparseMLP stacks them), so dX
    # and [dWg; dWu] are one GEMM each on CUDA
    mine = (x, mlp.up_proj.weight, mlp.down_proj.weight) + ((mlp.gate_proj.weight,) if gated else ())
    got = [t.grad.clone() for t in mine]
    x.grad = None
    y, l1 = dense(x)
    (y * dy).sum().add(0.1 * l1).backward()
    theirs = (x, dense.up_proj.weight, dense.down_proj.weight) + ((dense.gate_proj.weight,) if gated else ())
    for g, want in zip(got, (t.grad for t in theirs)):
        assert _rel(g, want) < 5 * tol


@pytest.mark.parametrize("device", DEVICES)
def test_l1_gradient_alone(device):
    torch.manual_seed(1)
    dense = DenseMLP(16, 48, True, device=device)
    x = torch.randn(7, 16, device=device, requires_grad=True)
    _, l1 = sparse_ffn(x, *_weights(dense))
    l1.backward()
    g = x.grad.clone()
    x.grad = None
    dense(x)[1].backward()
    assert g.abs().max() > 0
    assert _rel(g, x.grad) < 1e-5


class _ZeroFills(TorchDispatchMode):
    """Bytes of every tensor that an op creates filled with zeros (zeros, zeros_like, new_zeros)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("zeros", "zeros_like", "new_zeros"):
            self.made.append((out.dtype, out.numel() * out.element_size()))
        return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use", ["both", "y", "l1"])
def test_backward_fills_no_zero_gradient_for_the_saved_state(device, use):
    # the op's third output (the saved state, uint8, as large as a fraction of h) never gets a
    # gradient: the backward must not allocate and zero-fill one per layer and step. An unused
    # y or l1 still gives the right gradients (a zero dy, or a zero l1 coefficient)
    torch.manual_seed(3)
    dense = DenseMLP(16, 48, True, device=device)
    x = torch.randn(2, 9, 16, device=device, requires_grad=True)
    dy = torch.randn(2, 9, 16, device=device)
    y, l1 = sparse_ffn(x, *_weights(dense))
    loss = {"both": (y * dy).sum() + 0.3 * l1, "y": (y * dy).sum(), "l1": 0.3 * l1}[use]
    zeros = _ZeroFills()
    with zeros:
        loss.backward()
    assert not [m for m in zeros.made if m[0] == torch.uint8], zeros.made
    allowed = {"both": 0, "y": 4, "l1": x.numel() * x.element_size()}[use]  # the missing dl1 or dy
    assert sum(b for _, b in zeros.made) <= allowed, zeros.made
    got = [t.grad.clone() for t in (x,) + _weights(dense)]
    for t in (x,) + _weights(dense):
        t.grad = None
    yr, l1r = dense(x)
    {"both": (yr * dy).sum() + 0.3 * l1r, "y": (yr * dy).sum(), "l1": 0.3 * l1r}[use].backward()
    for g, t in zip(got, (x,) + _weights(dense)):
        if t.grad is None:  # l1 alone: the dense down_proj gets no gradient, twblas's is zero
            assert (g == 0).all()
        else:
            assert _rel(g, t.grad) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_no_tokens(device):
    dense = DenseMLP(8, 24, True, device=device)
    x = torch.zeros(0, 8, device=device, requires_grad=True)
    y, l1 = sparse_ffn(x, *_weights(dense))
    assert y.shape == (0, 8) and l1.item() == 0.0
    y.sum().backward()
    assert x.grad.shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_module_from_dense_state_dict_and_stats(device):
    torch.manual_seed(2)
    dense = DenseMLP(24, 72, True, device=device)
    mlp = SparseMLP.from_dense(dense)
    x = torch.randn(4, 6, 24, device=device)
    with torch.no_grad():
        assert _rel(mlp(x), dense(x)[0]) < 1e-5
    s = mlp.stats()
    assert s["tokens"] == 24 and 0 < s["mean_active"] <= 72 and s["max_active"] >= s["mean_active"]
    assert s["overflow_rows"] >= 0
    # a LLaMA-style MLP's state_dict loads as it is, and back
    other = SparseMLP(24, 72, device=device)
    other.load_state_dict(dense.state_dict())
    assert set(other.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    with torch.no_grad():
        assert torch.equal(other(x), mlp(x))
    twin = DenseMLP(24, 72, True, device=device)
    twin.load_state_dict(other.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(_weights(twin), _weights(dense)))
    plain = SparseMLP(24, 72, gated=False, device=device)
    assert plain(x).shape == x.shape and plain.l1.dim() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_eager_inference_equals_the_op(device):
    # eager inference skips the dispatcher; the op (autograd, torch.compile) must give the same
    # bits, also for new tensors that reuse the address and shape of freed ones (cached descriptors)
    torch.manual_seed(8)
    dense = DenseMLP(24, 64, True, device=device)
    w = _weights(dense)
    for seed in range(3):
        x = torch.randn(5, 24, device=device, generator=torch.Generator(device).manual_seed(seed))
        with torch.no_grad():
            y, l1 = sparse_ffn(x, *w)
            y_op, l1_op, _ = torch.ops.twblas.ffn_forward(x, *w, False, False)
            assert torch.equal(y, y_op) and torch.equal(l1, l1_op)
            assert _rel(y, dense(x)[0]) < 1e-5
        del x, y, y_op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gated", [True, False])
def test_eager_training_equals_the_op(device, gated):
    # eager training runs the ops' implementations under an autograd.Function, without the
    # dispatcher; the custom op with its registered autograd (what torch.compile traces) must give
    # the same bits: outputs, l1, and every gradient, l1's included
    torch.manual_seed(9)
    dense = DenseMLP(24, 64, gated, device=device)
    w = [t.detach() for t in _weights(dense) if t is not None]
    for seed in range(2):
        x = torch.randn(6, 24, device=device, generator=torch.Generator(device).manual_seed(seed))
        grads = []
        for via_op in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in [x] + w]
            xs, ws = leaves[0], leaves[1:]
            wg, wu, wd = (ws[0], ws[1], ws[2]) if gated else (None, ws[0], ws[1])
            if via_op:
                y, l1, _ = torch.ops.twblas.ffn_forward(xs, wg, wu, wd, True, False)
            else:
                y, l1 = sparse_ffn(xs, wg, wu, wd)
            (y.square().sum() + 0.3 * l1).backward()
            grads.append([y.detach(), l1.detach()] + [t.grad for t in leaves])
        assert all(torch.equal(a, b) for a, b in zip(*grads))
        assert _rel(grads[0][0], dense(x)[0]) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_neuron_counts(device):
    # each unit's count is the number of tokens whose gate is above zero, summed over forwards
    torch.manual_seed(6)
    dense = DenseMLP(16, 40, True, device=device)
    mlp = SparseMLP.from_dense(dense)
    x1, x2 = torch.randn(7, 16, device=device), torch.randn(3, 5, 16, device=device)
    with torch.no_grad():
        mlp(x1)
        mlp(x2)
        want = (dense.gate_proj(x1) > 0).sum(0) + (dense.gate_proj(x2) > 0).reshape(-1, 40).sum(0)
    got = mlp.neuron_counts(reset=True)
    assert got.dtype == torch.int64 and got.shape == (40,) and got.device == x1.device
    assert torch.equal(got, want.to(torch.int64)) and got.sum() > 0
    assert mlp.neuron_counts().sum() == 0  # reset
    with torch.no_grad():
        mlp(x1)
    assert torch.equal(mlp.neuron_counts(), (dense.gate_proj(x1) > 0).sum(0).to(torch.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_weights_followed_after_optimizer_step(device):
    torch.manual_seed(3)
    mlp = SparseMLP(16, 40, device=device)
    dense = DenseMLP(16, 40, True, device=device)
    dense.load_state_dict(mlp.state_dict())
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    x = torch.randn(9, 16, device=device)
    for _ in range(2):
        opt.zero_grad()
        (mlp(x).square().mean() + 0.01 * mlp.l1).backward()
        opt.step()
    with torch.no_grad():
        dense.load_state_dict(mlp.state_dict())
        assert _rel(mlp(x), dense(x)[0]) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_backward_on_another_thread_uses_the_forwards_descriptor(device):
    # autograd runs a CUDA backward on a thread of its own: it must find the forward's FFN
    # descriptor (which knows what the forward did), not make one of its own
    import threading

    torch.manual_seed(5)
    dense = DenseMLP(16, 48, True, device=device)
    sparse = SparseMLP.from_dense(dense)
    x = torch.randn(9, 16, device=device, requires_grad=True)
    out = {}
    made = torch.ops.twblas._cache_info()[1]
    thread = threading.Thread(target=lambda: out.update(y=sparse(x)))
    thread.start()
    thread.join()
    out["y"].sum().backward()  # on this thread
    assert torch.ops.twblas._cache_info()[1] == made + 1
    xr = x.detach().clone().requires_grad_(True)
    dense(xr)[0].sum().backward()
    assert _rel(x.grad, xr.grad) < 1e-5
    assert _rel(sparse.down_proj.weight.grad, dense.down_proj.weight.grad) < 1e-5


def test_descriptors_follow_moved_storage():
    # FSDP2 frees a weight's storage after use and re-allocates the same storage for the next
    # step, often elsewhere: the descriptor is re-pointed at the new memory (no new descriptor a
    # step, which would allocate, block and start the path choice over), and none piles up
    torch.manual_seed(17)
    dense = DenseMLP(16, 32, True)
    x = torch.randn(4, 16)
    ws = _weights(dense)
    assert _rel(sparse_ffn(x, *ws)[0], dense(x)[0]) < 1e-5
    held, made, repointed = torch.ops.twblas._cache_info()
    keep = []
    with torch.no_grad():
        for _ in range(6):
            for w in ws:
                values = w.clone()
                storage = w.untyped_storage()
                nbytes, old = storage.nbytes(), storage.data_ptr()
                for _ in range(16):  # until the allocator hands out other memory
                    storage.resize_(0)
                    keep.append(torch.empty(nbytes, dtype=torch.uint8))  # takes the freed memory
                    storage.resize_(nbytes)
                    if storage.data_ptr() != old:
                        break
                assert storage.data_ptr() != old
                w.copy_(values)
            assert _rel(sparse_ffn(x, *ws)[0], dense(x)[0]) < 1e-5
    info = torch.ops.twblas._cache_info()
    assert info[0] <= held
    assert info[1] == made
    assert info[2] == repointed + 6


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch.manual_seed(4)
    mlp = SparseMLP(16, 40, device=device)
    dense = DenseMLP(16, 40, True, device=device)
    dense.load_state_dict(mlp.state_dict())

    def step(x):
        y = mlp(x)
        return y.square().mean() + 1e-2 * mlp.l1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 5, 16, device=device, requires_grad=True)
    loss = compiled(x)
    loss.backward()
    ref = dense(x)[0].square().mean() + 1e-2 * dense(x)[1]
    assert abs(loss.item() - ref.item()) < 1e-5 * max(1.0, abs(ref.item()))
    gx = x.grad.clone()
    x.grad = None
    ref.backward()
    assert _rel(gx, x.grad) < 1e-4


def test_bad_inputs_raise_value_error():
    w = torch.randn(12, 8)
    wd = torch.randn(8, 12)
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="dtype"):
        sparse_ffn(x.double(), None, w.double(), wd.double())
    with pytest.raises(ValueError, match="one dtype"):
        sparse_ffn(x.half(), None, w, wd)
    with pytest.raises(ValueError, match="D ="):
        sparse_ffn(torch.randn(3, 9), None, w, wd)
    with pytest.raises(ValueError, match="w_down"):
        sparse_ffn(x, None, w, wd.T.contiguous())
    with pytest.raises(ValueError, match="w_gate"):
        sparse_ffn(x, torch.randn(11, 8), w, wd)
    with pytest.raises(ValueError):
        SparseMLP.from_dense(torch.nn.Module())


def test_c_library_message_reaches_python():
    # a bad descriptor made through the C API: its status and its own message become the error
    import ctypes

    from twblas import _lib as C

    d = ctypes.c_void_p()
    with pytest.raises(ValueError, match="TW_STATUS_INVALID_VALUE: .+"):
        C.check(C.lib().twCreateDnMat(ctypes.byref(d), -1, 2, 2, None, C.R_32F, C.ORDER_ROW), None, "twCreateDnMat")


# ---------------------------------------------------------------------------------------------
# the compiled ops (libtwblas_torch.so)


def _problem(gated, d=24, h=40, m=5, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    t = [torch.randn(m, d, generator=g), torch.randn(h, d, generator=g) if gated else None,
         torch.randn(h, d, generator=g), torch.randn(d, h, generator=g)]
    return [a.requires_grad_(grad) if a is not None else None for a in t]


@pytest.mark.parametrize("gated", [True, False])
def test_opcheck_ffn_forward_and_backward(gated):
    x, wg, wu, wd = _problem(gated)
    wd_in_place = torch.empty_strided(wd.shape, (1, wd.shape[0])).copy_(wd)
    # ffn_forward's saved state has bytes its forward never writes (they differ run to run), so
    # its eager and traced outputs cannot be compared bitwise: opcheck's AOT test runs on
    # sparse_ffn below, which decomposes into ffn_forward (forward and backward)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    for w_down in (wd, wd_in_place):
        for training in (False, True):
            torch.library.opcheck(torch.ops.twblas.ffn_forward.default, (x, wg, wu, w_down, training, False),
                                  test_utils=utils)
        y, l1, saved = torch.ops.twblas.ffn_forward(x, wg, wu, w_down, True, False)
        torch.library.opcheck(torch.ops.twblas.ffn_backward.default,
                              (x, wg, wu, w_down, saved, torch.randn_like(y), torch.tensor(0.3)))
        args = [a.detach().requires_grad_(True) if a is not None else None for a in (x, wg, wu, w_down)]
        torch.library.opcheck(torch.ops.twblas.sparse_ffn.default, (*args, False))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_down_weight_layouts_give_the_same_results_and_gradients(device, dtype, tol):
    # w_down (D, H) contiguous (the library copies it) and with strides (1, D) (read in place on
    # CUDA): the same values, the same results; the gradient comes in the weight's own layout
    torch.manual_seed(11)
    dense = DenseMLP(32, 80, True, dtype, device)
    x = torch.randn(7, 32, dtype=dtype, device=device)
    runs = []
    for relayout in (False, True):
        wg, wu, wd = (w.detach().clone().requires_grad_(True) for w in _weights(dense))
        if relayout:
            twblas_torch.down_weight_in_place_layout(wd)
            assert wd.stride() == (1, 32) and wd.shape == (32, 80)
        else:
            assert wd.is_contiguous()
        xs = x.clone().requires_grad_(True)
        y, l1 = sparse_ffn(xs, wg, wu, wd)
        (y.float().square().sum() + 0.2 * l1).backward()
        assert wd.grad.stride() == wd.stride()
        runs.append([y, l1, xs.grad, wg.grad, wu.grad, wd.grad])
    for a, b in zip(*runs):
        assert (torch.equal(a, b) if device == "cpu" else _rel(a, b) < tol)
    assert _rel(runs[1][0], dense(x)[0]) < tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_copies_of_the_descriptor(device, dtype):
    # TW_FFN_ATTR_WEIGHT_COPY_BYTES (-1: a library without it). CUDA reads SparseMLP's weights in
    # place (D a multiple of 8): no copy, so nothing to refresh after an optimizer step; the CPU
    # backend keeps its fp32 copy
    mlp = SparseMLP(32, 64, device=device, dtype=dtype)
    w = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    with torch.no_grad():
        mlp(torch.randn(3, 32, device=device, dtype=dtype))
    copies = torch.ops.twblas.ffn_weight_copy_bytes(*w)
    if copies == -1:
        pytest.skip("libtwblas without TW_FFN_ATTR_WEIGHT_COPY_BYTES")
    if device == "cuda":
        assert copies == 0
        # a contiguous (D, H) down weight is copied
        assert torch.ops.twblas.ffn_weight_copy_bytes(w[0], w[1], w[2].detach().contiguous()) > 0
    else:
        assert copies > 0


@pytest.mark.parametrize("device", DEVICES)
def test_forward_follows_torch_deterministic_algorithms(device):
    # each forward sets TW_FFN_ATTR_DETERMINISTIC as torch.use_deterministic_algorithms() has it:
    # on CUDA the library's default also runs paths whose sums vary in order from call to call
    # (dense mode; one and two tokens on the serving path); under torch's flag the bits repeat
    mlp = SparseMLP(32, 64, device=device, dtype=torch.bfloat16)
    w = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
    x = torch.randn(1, 32, device=device, dtype=torch.bfloat16, generator=torch.Generator(device).manual_seed(5))
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        with torch.no_grad():
            mlp(x)
            assert not torch.ops.twblas.ffn_deterministic(*w)
            torch.use_deterministic_algorithms(True)
            ys = [mlp(x) for _ in range(4)]
            assert torch.ops.twblas.ffn_deterministic(*w)
            assert all(torch.equal(ys[0], y) for y in ys[1:])
            torch.use_deterministic_algorithms(False)
            mlp(x)
            assert not torch.ops.twblas.ffn_deterministic(*w)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def test_sparse_mlp_keeps_down_weight_in_place_layout():
    mlp = SparseMLP(24, 72)
    w = mlp.down_proj.weight
    assert isinstance(w, torch.nn.Parameter) and w.shape == (24, 72) and w.stride() == (1, 24)
    # a LLaMA-style state_dict (contiguous tensors) loads into it and keeps the layout
    dense = DenseMLP(24, 72, True)
    mlp.load_state_dict(dense.state_dict())
    assert mlp.down_proj.weight is w and w.stride() == (1, 24)
    assert torch.equal(w, dense.down_proj.weight)
    # the helper: same object, same values, nothing to do a second time
    p = torch.nn.Parameter(torch.randn(6, 10))
    before, ptr = p.detach().clone(), None
    assert twblas_torch.down_weight_in_place_layout(p) is p
    assert p.stride() == (1, 6) and torch.equal(p, before) and isinstance(p, torch.nn.Parameter)
    ptr = p.data_ptr()
    twblas_torch.down_weight_in_place_layout(p)
    assert p.data_ptr() == ptr
    with pytest.raises(ValueError):
        twblas_torch.down_weight_in_place_layout(torch.randn(3))


@pytest.mark.parametrize("gated", [True, False])
def test_from_dense_shares_parameters(gated):
    torch.manual_seed(12)
    dense = DenseMLP(16, 48, gated)
    ptrs = {n: p.data_ptr() for n, p in dense.named_parameters() if n != "down_proj.weight"}
    values = {n: p.detach().clone() for n, p in dense.named_parameters()}
    mlp = SparseMLP.from_dense(dense)
    pairs = [("up_proj", mlp.up_proj, dense.up_proj), ("down_proj", mlp.down_proj, dense.down_proj)]
    if gated:
        pairs.append(("gate_proj", mlp.gate_proj, dense.gate_proj))
    for name, a, b in pairs:
        assert a.weight is b.weight and a.weight.data_ptr() == b.weight.data_ptr()
        assert isinstance(a.weight, torch.nn.Parameter)
        if name != "down_proj" and not gated:
            assert a.weight.data_ptr() == ptrs[f"{name}.weight"]
        assert torch.equal(a.weight, values[f"{name}.weight"])
    assert mlp.down_proj.weight.stride() == (1, 16)
    if gated:  # gate and up re-laid into one storage, up's rows right after gate's
        g, u = mlp.gate_proj.weight, mlp.up_proj.weight
        assert u.data_ptr() == g.data_ptr() + g.numel() * g.element_size()
    assert len(list(mlp.parameters())) == len(list(dense.parameters()))
    # the dense module computes as before with the re-laid weight; both see a step of one
    x = torch.randn(5, 16)
    with torch.no_grad():
        assert _rel(mlp(x), dense(x)[0]) < 1e-5
        mlp.up_proj.weight.mul_(0.5)
        assert _rel(mlp(x), dense(x)[0]) < 1e-5
    # a state_dict round trip: out to a plain dense module and back into a fresh SparseMLP
    sd = mlp.state_dict()
    assert set(sd) == {n for n, _ in dense.named_parameters()}
    twin = DenseMLP(16, 48, gated)
    twin.load_state_dict(sd)
    back = SparseMLP(16, 48, gated=gated)
    back.load_state_dict(twin.state_dict())
    assert back.down_proj.weight.stride() == (1, 16)
    with torch.no_grad():
        assert torch.equal(back(x), mlp(x))


def test_new_weights_at_the_address_of_freed_ones():
    # the descriptor cache is keyed by the weights' memory: other tensors that take the memory of
    # freed weights must get a descriptor of their own (their values, not the old copy's)
    torch.manual_seed(13)
    x = torch.randn(4, 16)
    for seed in range(4):
        dense = DenseMLP(16, 32, True)
        with torch.no_grad():
            for p in dense.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
            y, _ = sparse_ffn(x, *_weights(dense))
            assert _rel(y, dense(x)[0]) < 1e-5
        del dense, y


def test_in_place_weight_update_without_optimizer():
    torch.manual_seed(14)
    dense = DenseMLP(16, 32, True)
    x = torch.randn(4, 16)
    with torch.no_grad():
        sparse_ffn(x, *_weights(dense))
        for p in dense.parameters():
            p.mul_(-1.5)  # a version change: the library's copy (CPU backend) is refreshed
        assert _rel(sparse_ffn(x, *_weights(dense))[0], dense(x)[0]) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_weights_written_without_a_version_change(device):
    # `.data` writes (and FSDP2's all-gathers into the same storage) leave the version counter as it
    # was: a descriptor that keeps a copy (the CPU backend always; CUDA for nn.Linear's contiguous
    # down_proj.weight) must still use the new values
    torch.manual_seed(16)
    dense = DenseMLP(16, 32, True).to(device)
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        sparse_ffn(x, *_weights(dense))
        versions = [p._version for p in dense.parameters()]
        for p in dense.parameters():
            p.data.mul_(-1.5)
        assert [p._version for p in dense.parameters()] == versions
        assert _rel(sparse_ffn(x, *_weights(dense))[0], dense(x)[0]) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_compile_inductor_fullgraph_forward_and_backward(device):
    # the default backend (inductor): the ops' fake kernels, the C++ autograd traced into the
    # joint graph, the saved state of dynamic length between the two graphs
    torch.manual_seed(15)
    mlp = SparseMLP(16, 40, device=device)
    ref = SparseMLP(16, 40, device=device)
    ref.load_state_dict(mlp.state_dict())

    def step(m, x):
        y = m(x)
        return y.square().mean() + 1e-2 * m.l1

    compiled = torch.compile(step, fullgraph=True)
    for shape in ((2, 5, 16), (3, 16)):
        x = torch.randn(*shape, device=device)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        loss = compiled(mlp, xa)
        loss.backward()
        want = step(ref, xb)
        want.backward()
        assert abs(loss.item() - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
        assert _rel(xa.grad, xb.grad) < 1e-5
        for p, q in zip(mlp.parameters(), ref.parameters()):
            assert p.grad.stride() == q.grad.stride()
            assert _rel(p.grad, q.grad) < 1e-5
            p.grad = q.grad = None


def test_c_library_errors_through_the_ops():
    # errors the C library finds come through the op with its status and message
    import re

    w = torch.randn(12, 8)
    wd = torch.randn(8, 12)
    y, l1, saved = torch.ops.twblas.ffn_forward(torch.randn(3, 8), None, w, wd, True, False)
    with pytest.raises(RuntimeError, match="without gradients enabled"):
        torch.ops.twblas.ffn_backward(torch.randn(3, 8), None, w, wd, saved[:0], y, torch.tensor(0.0))
    with pytest.raises(ValueError, match="l1's gradient"):
        torch.ops.twblas.ffn_backward(torch.randn(3, 8), None, w, wd, saved, y, torch.zeros(2))
    # a saved state the CPU backend cannot have written: INVALID_VALUE, with the library's words
    bad = torch.full_like(saved, 255)
    with pytest.raises(ValueError, match=re.escape("twSpGEMMFusedBackward") + ".*TW_STATUS_INVALID_VALUE: .+"):
        torch.ops.twblas.ffn_backward(torch.randn(3, 8), None, w, wd, bad, y, torch.tensor(0.0))


def test_version_and_exports():
    import twblas

    assert twblas.__version__ == twblas.version()
    assert callable(twblas_torch.sparsify) and "sparsify" in twblas_torch.__all__
    assert {"sparse_ffn", "SparseMLP", "down_weight_in_place_layout"} <= set(twblas_torch.__all__)


def test_import_error_says_how_to_reinstall(tmp_path):
    # a package built without torch (no op library): importing twblas.torch says what to do
    import os
    import subprocess
    import sys

    env = dict(os.environ, TWBLAS_TORCH_LIBRARY=str(tmp_path / "missing.so"))
    code = "import twblas.torch"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "pip install --no-build-isolation" in r.stderr


def test_sparsify_takes_the_example_lms_dense_twin():
    # examples/pytorch/train_sparse_lm.py's dense twin (DenseMLPs in LlamaMLP's form): sparsify()
    # replaces its MLPs, sharing their Parameters, and the logits stay those of the dense model
    # (the whole-model benchmark measures this LM so)
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[3] / "examples" / "pytorch" / "train_sparse_lm.py"
    if not path.exists():
        pytest.skip(f"{path} is not there (tests run outside the repository)")
    spec = importlib.util.spec_from_file_location("train_sparse_lm", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    torch.manual_seed(4)
    lm = ex.LM(32, 2, 4, 96, 16, sparse=False)
    for blk in lm.blocks:
        blk.mlp.track_l1 = False
    ids = torch.randint(0, 256, (3, 16))
    call = lambda mlp, x: mlp(x)  # noqa: E731  (the example's blocks take a timer that calls the MLP)
    with torch.no_grad():
        want = lm(ids, call)
    params = {id(p) for p in lm.parameters()}
    _, n = twblas_torch.sparsify(lm, return_count=True)
    assert n == 2 and all(isinstance(blk.mlp, SparseMLP) for blk in lm.blocks)
    assert {id(p) for p in lm.parameters()} == params
    with torch.no_grad():
        got = lm(ids, call)
    assert _rel(got, want) < 1e-5
