# twblas.torch quick start: a tiny Llama with ReLU MLPs, its MLPs swapped for twblas's sparse FFN.
# Runs on the CPU (no download: the model is built from a config); on a GPU, set device = "cuda".
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from twblas.torch import sparsify

device = "cpu"
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, hidden_act="relu")
dense = LlamaForCausalLM(config).to(device).eval()
sparse = LlamaForCausalLM(config).to(device).eval()
sparse.load_state_dict(dense.state_dict())

sparse, n = sparsify(sparse, return_count=True)   # in place; shares the model's Parameters
print(f"replaced {n} MLPs:", type(sparse.model.layers[0].mlp).__name__)

ids = torch.randint(0, config.vocab_size, (2, 16), device=device)
with torch.no_grad():
    ref = dense(ids).logits
    out = sparse(ids).logits
err = (out - ref).abs().max().item()
print(f"max |logits - dense logits| = {err:.2e}")
assert err < 1e-3, err
