"""twblas.torch.sparsify on tiny Hugging Face transformers models (Llama, Mistral, Qwen2 with
hidden_act="relu"; Nemotron for the plain ReLU MLP): logits and greedy generation against the
dense model, shared Parameters, state_dict round trips, training gradients, refusals,
torch.compile; CUDA variants (bf16, a CUDA-graph decode step on a static cache) where a GPU is
there. Skipped as a whole without transformers.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import twblas.torch as tt  # noqa: E402
from twblas.torch import SparseMLP, sparse_ffn  # noqa: E402

try:
    sparsify = tt.sparsify
except AttributeError:  # a twblas.torch from before the re-export
    from twblas._sparsify import sparsify

D, H, V, LAYERS = 64, 176, 128, 2


from _support import cuda_usable as _cuda_usable  # noqa: E402


CUDA = _cuda_usable()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device or a CPU-only libtwblas")

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
}


def _config(family, act="relu", **kw):
    cname, _, extra = FAMILIES[family]
    args = dict(hidden_size=D, intermediate_size=H, num_hidden_layers=LAYERS, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=V, hidden_act=act, max_position_embeddings=256,
                tie_word_embeddings=False)
    args.update(extra)
    args.update(kw)
    cfg = getattr(transformers, cname)(**args)
    cfg._attn_implementation = "sdpa"
    return cfg


def _model(family, dtype=torch.float32, device="cpu", seed=0, **kw):
    cfg = _config(family, **kw)
    torch.manual_seed(seed)
    m = getattr(transformers, FAMILIES[family][1])(cfg)
    return m.to(device=device, dtype=dtype).eval()


def _ids(batch=2, seq=19, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, seq), generator=g).to(device)


def _mlps(model):
    return [layer.mlp for layer in model.model.layers]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_dense(family, dtype, device):
    model = _model(family, dtype, device)
    ids = _ids(device=device)
    ref = _logits(model, ids)
    old = _mlps(model)
    out_model, n = sparsify(model, return_count=True)
    assert out_model is model and n == LAYERS
    assert all(isinstance(m, SparseMLP) for m in _mlps(model))
    # the same Parameter objects, not copies
    for new, o in zip(_mlps(model), old):
        assert new.gate_proj.weight is o.gate_proj.weight
        assert new.up_proj.weight is o.up_proj.weight
        assert new.down_proj.weight is o.down_proj.weight
    assert len(list(model.parameters())) == len(set(map(id, model.parameters())))
    out = _logits(model, ids)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert _rel(out, ref) < TOL[dtype]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_generate_matches_dense(family, cache):
    model = _model(family)
    ids = _ids(batch=2, seq=7)
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=12, do_sample=False, attention_mask=mask, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    ref = model.generate(ids, **kw)
    sparsify(model)
    out = model.generate(ids, **kw)
    assert out.shape == ref.shape and torch.equal(out, ref)


def test_state_dict_round_trip():
    model = _model("llama")
    dense_keys = list(model.state_dict().keys())
    sparsify(model)
    sd = model.state_dict()
    assert list(sd.keys()) == dense_keys
    ids = _ids()
    want = _logits(model, ids)
    # into a fresh dense model of another seed
    fresh = _model("llama", seed=5)
    assert _rel(_logits(fresh, ids), want) > 1e-2
    fresh.load_state_dict(sd, strict=True)
    assert _rel(_logits(fresh, ids), want) < TOL[torch.float32]
    # and a dense checkpoint into a sparsified model of another seed
    other = sparsify(_model("llama", seed=7))
    other.load_state_dict(fresh.state_dict(), strict=True)
    assert _rel(_logits(other, ids), want) < TOL[torch.float32]


def test_save_pretrained_round_trip(tmp_path):
    model = _model("qwen2")
    sparsify(model)
    ids = _ids()
    want = _logits(model, ids)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert _rel(_logits(loaded, ids), want) < TOL[torch.float32]
    sparsify(loaded)
    assert _rel(_logits(loaded, ids), want) < TOL[torch.float32]


def test_training_gradients_match_dense():
    dense = _model("llama").train()
    sparse = sparsify(copy.deepcopy(dense))
    ids = _ids(batch=2, seq=16)
    for m in (dense, sparse):
        m.zero_grad()
        m(ids, labels=ids).loss.backward()
    pd, ps = dict(dense.named_parameters()), dict(sparse.named_parameters())
    assert pd.keys() == ps.keys()
    for k in pd:
        assert ps[k].grad is not None, k
        assert _rel(ps[k].grad, pd[k].grad) < 1e-4, k
    # an optimizer built on the dense model's parameters trains the sparsified model
    opt = torch.optim.AdamW(sparse.parameters(), lr=1e-3)
    opt.step()
    assert _rel(_logits(sparse.eval(), ids), _logits(dense.eval(), ids)) > 1e-6


def test_l1_of_each_layer():
    model = sparsify(_model("llama"))
    ids = _ids()
    _logits(model, ids)
    for m in _mlps(model):
        assert m.l1 is not None and torch.isfinite(m.l1) and m.l1.item() > 0
        assert m.stats()["tokens"] == ids.numel()


def test_plain_relu_mlp():
    cfg = transformers.NemotronConfig(hidden_size=D, intermediate_size=H, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                                      hidden_act="relu", max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.NemotronForCausalLM(cfg).eval()
    ids = _ids()
    ref = _logits(model, ids)
    old = _mlps(model)
    _, n = sparsify(model, return_count=True)
    assert n == LAYERS
    for new, o in zip(_mlps(model), old):
        assert isinstance(new, SparseMLP) and not new.gated
        assert new.up_proj.weight is o.up_proj.weight and new.down_proj.weight is o.down_proj.weight
    assert _rel(_logits(model, ids), ref) < TOL[torch.float32]


def test_custom_modules_and_functional_relu():
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(D, H, bias=False)
            self.up_proj = torch.nn.Linear(D, H, bias=False)
            self.down_proj = torch.nn.Linear(H, D, bias=False)
            self.act_fn = torch.nn.functional.relu

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    torch.manual_seed(0)
    net = torch.nn.Sequential(MLP(), torch.nn.LayerNorm(D), MLP())
    x = torch.randn(5, D)
    with torch.no_grad():
        ref = net(x)
    _, n = sparsify(net, return_count=True)
    assert n == 2 and isinstance(net[0], SparseMLP) and isinstance(net[2], SparseMLP)
    with torch.no_grad():
        assert _rel(net(x), ref) < TOL[torch.float32]
    # a second call finds nothing left to replace
    assert sparsify(net, return_count=True)[1] == 0
    with pytest.raises(ValueError, match="the model itself is an MLP"):
        sparsify(MLP())


@pytest.mark.parametrize("act", ["silu", "gelu", "relu2"])
def test_refuses_other_activations(act):
    model = _model("llama", act=act)
    before = _mlps(model)
    with pytest.raises(ValueError) as e:
        sparsify(model)
    msg = str(e.value)
    assert "model.layers.0.mlp" in msg and "LlamaMLP" in msg and act in msg and "strict=False" in msg
    assert _mlps(model) == before  # nothing replaced
    out, n = sparsify(model, strict=False, return_count=True)
    assert out is model and n == 0 and _mlps(model) == before


def test_refuses_bias():
    model = _model("llama", mlp_bias=True)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp \(LlamaMLP\)\.gate_proj has a bias"):
        sparsify(model)
    assert sparsify(model, strict=False, return_count=True)[1] == 0


def test_strict_false_mixes():
    model = _model("llama")
    model.model.layers[1].mlp.act_fn = torch.nn.SiLU()  # one layer of another activation
    ids = _ids()
    ref = _logits(model, ids)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp.*SiLU"):
        sparsify(model)
    assert not any(isinstance(m, SparseMLP) for m in _mlps(model))
    _, n = sparsify(model, strict=False, return_count=True)
    assert n == 1 and isinstance(model.model.layers[0].mlp, SparseMLP)
    assert not isinstance(model.model.layers[1].mlp, SparseMLP)
    assert _rel(_logits(model, ids), ref) < TOL[torch.float32]


def test_down_in_place_option():
    model = _model("llama")
    ids = _ids()
    ref = _logits(model, ids)
    old = _mlps(model)
    sparsify(model, down_in_place=False, save_dense=True)
    for new, o in zip(_mlps(model), old):
        assert new.down_proj is o.down_proj and new.down_proj.weight.is_contiguous()
        assert new.gate_proj is o.gate_proj and new.up_proj is o.up_proj and new.save_dense
    assert _rel(_logits(model, ids), ref) < TOL[torch.float32]


def test_gate_up_stacked():
    """sparsify re-lays each gated MLP's gate_proj and up_proj weights into one storage (up's rows
    right after gate's), the same Parameters with the same values; down_in_place=False leaves them."""
    model = _model("llama")
    before = [(m.gate_proj.weight.detach().clone(), m.up_proj.weight.detach().clone()) for m in _mlps(model)]
    sparsify(model)
    for mlp, (g, u) in zip(_mlps(model), before):
        gw, uw = mlp.gate_proj.weight, mlp.up_proj.weight
        assert isinstance(gw, torch.nn.Parameter) and gw.is_contiguous() and uw.is_contiguous()
        assert uw.data_ptr() == gw.data_ptr() + gw.numel() * gw.element_size()
        assert torch.equal(gw, g) and torch.equal(uw, u)
    other = _model("llama")
    sparsify(other, down_in_place=False)
    for mlp in _mlps(other):
        gw, uw = mlp.gate_proj.weight, mlp.up_proj.weight
        assert gw.untyped_storage().data_ptr() != uw.untyped_storage().data_ptr()


def test_hooks_kept():
    model = _model("llama")
    seen = []
    model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    sparsify(model)
    _logits(model, _ids())
    assert seen == ["SparseMLP"]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_cpu(backend):
    model = _model("llama")
    ids = _ids()
    ref = _logits(model, ids)
    sparsify(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    assert _rel(_logits(compiled, ids), ref) < TOL[torch.float32]
    assert _rel(_logits(compiled, _ids(seed=3)), _logits(model, _ids(seed=3))) < TOL[torch.float32]


@needs_cuda
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cuda_greedy_generate_fp32(family):
    model = _model(family, device="cuda")
    ids = _ids(batch=2, seq=7, device="cuda")
    kw = dict(max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    ref = model.generate(ids, **kw)
    sparsify(model)
    assert torch.equal(model.generate(ids, **kw), ref)


@needs_cuda
def test_cuda_generate_static_cache_compiled():
    """generate() on a StaticCache with the forward under torch.compile (inductor, the default
    mode; the op's fake kernels): the dense model's greedy tokens. mode="reduce-overhead" is left
    out: torch's cudagraph trees refuse transformers' StaticCache (its cumulative_length is
    written in place between invocations) for the dense model as well; the CUDA-graph capture of
    the op itself is test_cuda_graph_sparse_mlp."""
    model = _model("llama", device="cuda")
    ids = _ids(batch=2, seq=7, device="cuda")
    kw = dict(max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0,
              cache_implementation="static")
    ref = model.generate(ids, **kw)
    sparsify(model)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward)
    try:
        assert torch.equal(model.generate(ids, **kw), ref)
    finally:
        torch._dynamo.reset()


@needs_cuda
def test_cuda_graph_sparse_mlp():
    """One SparseMLP forward (bf16) captured in a torch.cuda.CUDAGraph after a warm-up on a side
    stream, replayed on new inputs copied into the static input: each replay equals eager."""
    d, h, n = 64, 176, 24
    torch.manual_seed(5)
    mlp = SparseMLP(d, h, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            lin.weight.normal_(0, 0.1)
        # a few units a token, as in a sparse model: input channel 0 is 1 and gives every gate -1.5
        mlp.gate_proj.weight[:, 0] = -1.5
    xs = [torch.randn(n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for x in xs:
        x[:, 0] = 1
    with torch.no_grad():
        ref = [mlp(x).clone() for x in xs]
        static_x = xs[0].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                mlp(static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = mlp(static_x)
        got = []
        for x in reversed(xs):
            static_x.copy_(x)
            graph.replay()
            got.append(static_y.clone())
    torch.cuda.synchronize()
    for a, r in zip(got, reversed(ref)):
        assert torch.isfinite(a).all()
        assert _rel(a, r) < 1e-2


def _cache_kw(cache):
    """The cache keyword of this transformers' LlamaModel.forward (5.17: past_key_values; later
    5.x: cache)."""
    import inspect

    params = inspect.signature(transformers.LlamaModel.forward).parameters
    return {("cache" if "cache" in params else "past_key_values"): cache, "use_cache": True}


@needs_cuda
def test_cuda_graph_decode_step_static_cache():
    """One decode step on a StaticCache captured in a CUDA graph and replayed: the hidden states
    of every replay equal the eager twblas model's steps (and the dense model's, loosely).

    No cache crop (StaticLayer has none in transformers 5.17): the warm-up before capture is a
    real step (the context's last token, the prefill having taken the ones before), and the
    eager references run the same sequence on fresh caches; capture runs nothing, so each replay
    advances the cache's length (a device tensor) by one."""
    model = _model("llama", dtype=torch.bfloat16, device="cuda")
    base = model.model
    ctx, steps, b = 9, 6, 2
    ids = _ids(batch=b, seq=ctx + steps, device="cuda")

    def new_cache():
        return transformers.StaticCache(config=model.config, max_cache_len=ctx + steps + 1)

    def run_eager(m):
        cache = new_cache()
        with torch.no_grad():
            m(input_ids=ids[:, :ctx - 1], **_cache_kw(cache))
            m(input_ids=ids[:, ctx - 1:ctx], **_cache_kw(cache))
            return [m(input_ids=ids[:, ctx + i:ctx + i + 1], **_cache_kw(cache)).last_hidden_state.clone()
                    for i in range(steps)]

    dense = run_eager(base)
    sparsify(model)
    eager = run_eager(base)
    for a, r in zip(eager, dense):
        assert _rel(a, r) < TOL[torch.bfloat16]

    cache = new_cache()
    tok = torch.zeros(b, 1, dtype=torch.long, device="cuda")
    with torch.no_grad():
        base(input_ids=ids[:, :ctx - 1], **_cache_kw(cache))
        # the warm-up (handles, workspaces, the cache's lazy set-up) on a side stream: the real
        # step of token ctx - 1
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            tok.copy_(ids[:, ctx - 1:ctx])
            base(input_ids=tok, **_cache_kw(cache))
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = base(input_ids=tok, **_cache_kw(cache)).last_hidden_state
        got = []
        for i in range(steps):
            tok.copy_(ids[:, ctx + i:ctx + i + 1])
            graph.replay()
            got.append(out.clone())
    torch.cuda.synchronize()
    for a, r in zip(got, eager):
        assert _rel(a, r) < 1e-2


@pytest.fixture
def process_group():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_ddp_one_process(process_group):
    """DDP (gloo, one process) over a sparsified model: its Parameters are the model's own, the
    reducer's gradients equal the unwrapped dense model's."""
    dense = _model("llama").train()
    sparse = sparsify(copy.deepcopy(dense))
    ddp = torch.nn.parallel.DistributedDataParallel(sparse)
    ids = _ids(batch=2, seq=16)
    dense(ids, labels=ids).loss.backward()
    ddp(ids, labels=ids).loss.backward()
    for (k, p), (k2, q) in zip(dense.named_parameters(), ddp.module.named_parameters()):
        assert k == k2 and q.grad is not None and _rel(q.grad, p.grad) < 1e-4, k


def test_fsdp2_one_process(process_group):
    """FSDP2 (fully_shard per decoder layer and the root, gloo, one process, CPU) over a
    sparsified model: the forward and the gradients equal the dense model's."""
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError:
        pytest.skip("no FSDP2 in this torch")
    dense = _model("llama").train()
    sparse = sparsify(copy.deepcopy(dense), down_in_place=False)  # FSDP2 needs contiguous Parameters
    ids = _ids(batch=2, seq=16)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in sparse.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sparse, mesh=mesh)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        pytest.skip(f"FSDP2 on the CPU is not supported here: {e}")
    assert all(isinstance(layer.mlp, SparseMLP) for layer in sparse.model.layers)
    ref = dense(ids, labels=ids)
    out = sparse(ids, labels=ids)
    assert _rel(out.logits, ref.logits) < TOL[torch.float32]
    ref.loss.backward()
    out.loss.backward()
    for (k, p), (k2, q) in zip(dense.named_parameters(), sparse.named_parameters()):
        g = q.grad.full_tensor() if hasattr(q.grad, "full_tensor") else q.grad
        assert k == k2 and _rel(g, p.grad) < 1e-4, k
