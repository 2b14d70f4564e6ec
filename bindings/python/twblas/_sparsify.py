"""twblas.torch.sparsify: a model's ReLU MLPs replaced by twblas SparseMLPs, in place.

    from twblas.torch import sparsify
    model = AutoModelForCausalLM.from_config(config)   # hidden_act="relu"
    sparsify(model)                                    # every ReLU MLP now runs on twblas

What is replaced: every submodule shaped like a Hugging Face transformers MLP
  * gated:  gate_proj, up_proj, down_proj (nn.Linear, no bias), down(act(gate(x)) * up(x))
            (LlamaMLP, MistralMLP, Qwen2MLP, and the many models that copy them), and
  * plain:  up_proj, down_proj (nn.Linear, no bias), down(act(up(x))) (NemotronMLP's form),
whose activation is ReLU: the module's act_fn (or activation_fn / act / activation) is an
nn.ReLU or F.relu, or, where the module has none of those, its config's hidden_act is "relu".

The replacement is SparseMLP.from_dense(module) holding the module's own Linear layers, so its
own Parameter objects (gate_proj.weight, up_proj.weight, down_proj.weight): the state_dict keys,
the optimizer's parameters, DDP and FSDP2 wrapping (see down_in_place) and checkpoints are those
of the dense model; a dense model of the same class loads its state_dict as it is. The
replacement keeps the module's training flag and its forward hooks.

What is refused (ValueError naming the module, its class and what is wrong), before anything
is replaced: an MLP of another activation (silu, gelu, relu2, ...), projections with a bias,
weights of a dtype twblas does not compute (fp32, fp16 and bf16 only), and modules dispatched
by accelerate (device_map offloading hooks; sparsify before dispatching). strict=False leaves
such modules as they are instead (the model then mixes dense and twblas MLPs).
"""

from typing import Optional

import torch

from ._ops import SparseMLP

__all__ = ["sparsify"]

_ACT_ATTRS = ("act_fn", "activation_fn", "act", "activation")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _is_relu(act) -> bool:
    if isinstance(act, torch.nn.ReLU):  # nn.ReLU6 and HF's ReLUSquaredActivation are not ReLUs
        return True
    return act is torch.relu or act is torch.nn.functional.relu or act is torch.relu_


def _config_act(module, model):
    for owner in (module, model):
        cfg = getattr(owner, "config", None)
        if cfg is None:
            continue
        for key in ("hidden_act", "hidden_activation", "activation_function"):
            v = getattr(cfg, key, None)
            if isinstance(v, str):
                return v
    return None


def _activation(module, model):
    """(is_relu, a name for messages) of an MLP module."""
    for attr in _ACT_ATTRS:
        act = getattr(module, attr, None)
        if act is None:
            continue
        if _is_relu(act):
            return True, "relu"
        cfg = _config_act(module, model)
        name = type(act).__name__ if isinstance(act, torch.nn.Module) else getattr(act, "__name__", repr(act))
        return False, f"{name} (config hidden_act={cfg!r})" if cfg else name
    cfg = _config_act(module, model)
    if cfg == "relu":
        return True, "relu"
    return False, repr(cfg) if cfg else "unknown (no act_fn attribute nor config.hidden_act)"


def _linear(module, name):
    lin = getattr(module, name, None)
    return lin if isinstance(lin, torch.nn.Linear) else None


def _candidate(module):
    """'gated', 'plain' or None: whether the module is shaped like an HF MLP."""
    if isinstance(module, SparseMLP):
        return None
    if _linear(module, "up_proj") is None or _linear(module, "down_proj") is None:
        return None
    if getattr(module, "gate_proj", None) is not None:
        return "gated" if _linear(module, "gate_proj") is not None else None
    return "plain"


def _problem(name, module, kind, model):
    """Why `module` cannot become a SparseMLP, or None."""
    what = f"{name or 'the model'} ({type(module).__name__})"
    relu, act = _activation(module, model)
    if not relu:
        return (f"twblas.sparsify: {what} uses activation {act}; twblas computes ReLU MLPs only "
                "(hidden_act='relu'). Pass strict=False to leave such modules dense.")
    names = ("gate_proj", "up_proj", "down_proj") if kind == "gated" else ("up_proj", "down_proj")
    lins = [getattr(module, n) for n in names]
    for n, lin in zip(names, lins):
        if lin.bias is not None:
            return (f"twblas.sparsify: {what}.{n} has a bias; twblas's FFN has none (mlp_bias=False). "
                    "Pass strict=False to leave such modules dense.")
        if lin.weight.dtype not in _DTYPES:
            return (f"twblas.sparsify: {what}.{n}.weight is {lin.weight.dtype}; twblas computes float32, "
                    "float16 and bfloat16. Pass strict=False to leave such modules dense.")
        if lin.weight.device != lins[0].weight.device or lin.weight.dtype != lins[0].weight.dtype:
            return f"twblas.sparsify: {what}'s projections are on different devices or of different dtypes."
    up, down = module.up_proj, module.down_proj
    if down.in_features != up.out_features or down.out_features != up.in_features or (
            kind == "gated" and tuple(module.gate_proj.weight.shape) != tuple(up.weight.shape)):
        return f"twblas.sparsify: {what}'s projections do not form a D -> H -> D MLP."
    if hasattr(module, "_hf_hook") or any(hasattr(getattr(module, n), "_hf_hook") for n in names):
        return (f"twblas.sparsify: {what} carries an accelerate hook (device_map dispatch or offloading); "
                "sparsify the model before dispatching it.")
    extra = [n for n, c in module.named_children() if n not in names and n not in _ACT_ATTRS
             and (any(True for _ in c.parameters()) or (isinstance(c, torch.nn.Dropout) and c.p > 0))]
    if extra:
        return (f"twblas.sparsify: {what} has submodules beyond the projections and the activation "
                f"({', '.join(extra)}): not a plain MLP.")
    return None


def _replacement(module, down_in_place: bool, save_dense: Optional[bool]):
    names = [n for n in ("gate_proj", "up_proj", "down_proj") if getattr(module, n, None) is not None]
    if down_in_place:
        # shares the Parameters and re-lays down_proj.weight's storage for the kernels
        new = SparseMLP.from_dense(module)
    else:
        up = module.up_proj
        new = SparseMLP(up.in_features, up.out_features, gated="gate_proj" in names, device="meta",
                        dtype=up.weight.dtype)
    # the module's own Linear layers (holding its Parameters): whatever refers to them (hooks,
    # FSDP2's parameter bookkeeping, a from_dense that copies) sees the model's objects
    for n in names:
        setattr(new, n, getattr(module, n))
    new.save_dense = save_dense
    new.train(module.training)
    # hooks users put on the MLP (profilers, activation capture) keep working
    for attr in ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
                 "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                 "_backward_pre_hooks"):
        src, dst = getattr(module, attr, None), getattr(new, attr, None)
        if src and dst is not None:
            dst.update(src)
    return new


def sparsify(model: torch.nn.Module, strict: bool = True, return_count: bool = False,
             down_in_place: bool = True, save_dense: Optional[bool] = None):
    """Replaces every ReLU MLP of `model` (see the module's docstring) by a twblas SparseMLP
    sharing its Parameters, in place. Returns the model; with return_count=True, (model, n)
    where n is the number of MLPs replaced.

    strict=True (the default): any MLP-shaped module twblas cannot compute (another activation,
    a bias, another dtype) raises ValueError naming it, and nothing is replaced. strict=False
    leaves those modules dense and replaces the rest.

    down_in_place=True (the default): down_proj.weight's storage is re-laid into the layout the
    CUDA kernels read in place (strides (1, D); same Parameter, shape and values), and a gated
    MLP's gate_proj.weight and up_proj.weight into one storage (gate_up_stacked_layout: the
    dense-mode training step's dX and [dWg; dWu] then take one GEMM each). FSDP2 refuses
    non-contiguous Parameters: for fully_shard, pass down_in_place=False (the library then keeps
    its own copy of each down weight, and gate and up keep their storages) and sparsify before
    sharding.
    save_dense: SparseMLP's save_dense for every replacement (training; see sparse_ffn)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"twblas.sparsify: expected a torch.nn.Module, got {type(model).__name__}")
    plan, skipped = [], []
    claimed = []  # names of modules to replace: their submodules are not visited again
    for name, module in model.named_modules():
        if any(name.startswith(c + ".") for c in claimed):
            continue
        kind = _candidate(module)
        if kind is None:
            continue
        problem = _problem(name, module, kind, model)
        if problem is not None:
            if strict:
                raise ValueError(problem)
            skipped.append(name)
            continue
        if name == "":
            raise ValueError("twblas.sparsify: the model itself is an MLP; use SparseMLP.from_dense(model)")
        plan.append((name, module))
        claimed.append(name)
    count = 0
    for name, module in plan:
        new = _replacement(module, down_in_place, save_dense)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
        count += 1
    return (model, count) if return_count else model
