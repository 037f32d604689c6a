"""The Python proof of `tributary export --format hf`: loads an exported directory with plain PyTorch (no
`transformers`, no `safetensors` package: the file format is read by the few lines below), runs the Llama forward pass
as Hugging Face's modeling_llama writes it, and writes the logits for the given tokens.

  /usr/bin/python3 tests/reference/hf_llama_logits.py DIR --tokens "1,2,3;4,5,6" --out logits.f32

The tokens are rows of equal length separated by ';'. The output is the logits (rows, length, vocab_size) as raw
little-endian float32, its shape printed on stdout as JSON. The C++ tests compare it with tributary's own forward pass;
nothing here is shared with the C++ code but the file format."""
import argparse
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_safetensors(path):
    """name -> tensor, from the format's definition: u64 header length, JSON header, then the raw data."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(body[begin:end])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]).float()
    return tensors


def rms_norm(x, weight, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):  # (B, KV, T, D) -> (B, KV * n_rep, T, D), each key/value head serving n_rep query heads
    b, kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


def llama_logits(cfg, w, tokens):
    B, T = tokens.shape
    C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads") or H
    D = C // H
    eps = cfg["rms_norm_eps"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(L):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        scores = q @ k.transpose(2, 3) / math.sqrt(D) + mask
        o = torch.softmax(scores, dim=-1, dtype=torch.float32) @ v
        x = x + o.transpose(1, 2).reshape(B, T, C) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--tokens", required=True, help="rows of comma-separated ids, rows separated by ';'")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(f"{args.dir}/config.json") as f:
        cfg = json.load(f)
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        sys.exit(f"{args.dir}/config.json: architectures = {cfg.get('architectures')}, expected LlamaForCausalLM")
    w = read_safetensors(f"{args.dir}/model.safetensors")
    tokens = torch.tensor([[int(t) for t in row.split(",")] for row in args.tokens.split(";")], dtype=torch.int64)
    torch.set_num_threads(1)
    with torch.no_grad():
        logits = llama_logits(cfg, w, tokens).contiguous()
    with open(args.out, "wb") as f:
        f.write(logits.numpy().astype("<f4").tobytes())
    print(json.dumps({"shape": list(logits.shape)}))


if __name__ == "__main__":
    main()
