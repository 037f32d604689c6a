"""Golden values for the C++ model, from PyTorch (the one the build links: TRIBUTARY_PYTHON) and an independent
Python model.

For each variant, writes OUT/<variant>/:
  weights.safetensors  every parameter (fixed by a seed)
  golden.safetensors   tokens (B, T+1) int64, logits (B, T, V), loss (1), grad.<name> for every parameter,
                       and after.<name>: parameters after 3 AdamW steps (lr 1e-2, wd 0.1, betas 0.9/0.95)
  golden_bf16.safetensors  logits, loss and every gradient of the same step under torch.autocast (CPU, bf16)
  config.toml          the model config in Tributary's keys
Safetensors are written with numpy + json (no safetensors package in Debian)."""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Transformer, loss_fn  # noqa: E402

VARIANTS = {
    "swiglu_rope_tied": dict(vocab_size=67, num_layers=2, num_levels=2, width=32, num_heads=4, context=16,
                             mlp="swiglu", positions="rope", tie_embeddings=True),
    "gelu_learned_untied": dict(vocab_size=67, num_layers=3, num_levels=1, width=24, num_heads=2, context=16,
                                mlp="gelu", positions="learned", tie_embeddings=False),
}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        arr = tensors[name].detach().contiguous().numpy()
        dtype = {np.float32: "F32", np.int64: "I64"}[arr.dtype.type]
        data = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - (8 + len(raw)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return str(v)


def make(variant, kwargs, out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    cfg = Config(**kwargs)
    model = Transformer(cfg).double().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)  # larger than training init so every term of the gradients matters
            else:
                p.uniform_(0.5, 1.5)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    write_safetensors(os.path.join(out, "weights.safetensors"), weights)

    B, T = 3, cfg.context
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1))
    logits = model(tokens[:, :T])
    loss = loss_fn(logits, tokens[:, 1:])
    loss.backward()
    golden = {"tokens": tokens, "logits": logits, "loss": loss.reshape(1)}
    for n, p in model.named_parameters():
        golden["grad." + n] = p.grad.clone()

    # train.precision = bf16: the same step under PyTorch's own autocast (fp32 weights, bf16 matmuls), the loss on
    # fp32 logits.
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits16 = model(tokens[:, :T])
    loss16 = loss_fn(logits16.float(), tokens[:, 1:])
    loss16.backward()
    bf16 = {"logits": logits16.float(), "loss": loss16.reshape(1)}
    for n, p in model.named_parameters():
        bf16["grad." + n] = p.grad.clone()
    write_safetensors(os.path.join(out, "golden_bf16.safetensors"), bf16)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model(tokens[:, :T]), tokens[:, 1:]).backward()
        opt.step()
    for n, p in model.named_parameters():
        golden["after." + n] = p.detach().clone()
    write_safetensors(os.path.join(out, "golden.safetensors"), golden)
    with open(os.path.join(out, "config.toml"), "w") as f:
        f.write("[model]\n")
        for k, v in kwargs.items():
            f.write(f"{k} = {toml_value(v)}\n")


def make_adamw(out):
    """AdamW alone on fixed gradients: the optimizer's arithmetic without model rounding in the way."""
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(99)
    matrix, vector = torch.randn(5, 7), torch.rand(7) + 0.5
    grads = [(torch.randn(5, 7), torch.randn(7)) for _ in range(3)]
    golden = {"matrix": matrix.clone(), "vector": vector.clone()}
    for i, (gm, gv) in enumerate(grads):
        golden[f"grad{i}.matrix"], golden[f"grad{i}.vector"] = gm, gv
    pm, pv = nn_param(matrix), nn_param(vector)
    opt = torch.optim.AdamW([{"params": [pm], "weight_decay": 0.1}, {"params": [pv], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for gm, gv in grads:
        pm.grad, pv.grad = gm.clone(), gv.clone()
        opt.step()
    golden["after.matrix"], golden["after.vector"] = pm.detach().clone(), pv.detach().clone()
    write_safetensors(os.path.join(out, "golden.safetensors"), golden)


def nn_param(t):
    return torch.nn.Parameter(t.clone())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for variant, kwargs in VARIANTS.items():
        make(variant, kwargs, os.path.join(args.out, variant))
    make_adamw(os.path.join(args.out, "adamw"))
    print(f"wrote golden values for {len(VARIANTS)} variants to {args.out}")


if __name__ == "__main__":
    main()
