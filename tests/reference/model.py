"""PyTorch reference of Tributary's transformer (src/tributary/model/transformer.cpp), written independently in
idiomatic PyTorch eager (nanoGPT/Llama style) with the same parameter names, so that

  * tests/reference/make_golden.py can check the C++ model's logits, loss and every gradient against it, and
  * bench/torch_eager.py can measure PyTorch eager on the same model and batch.

Runs under the Python whose PyTorch the build links (./run passes it as TRIBUTARY_PYTHON; .venv/bin/python3)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, vocab_size=257, num_layers=4, num_levels=1, width=256, num_heads=4, context=256,
                 mlp="swiglu", mlp_hidden=0, positions="rope", tie_embeddings=True, rope_theta=10000.0,
                 norm_eps=1e-5, init_std=0.02):
        self.__dict__.update(locals())
        del self.__dict__["self"]

    def hidden(self):
        if self.mlp_hidden > 0:
            return self.mlp_hidden
        if self.mlp == "gelu":
            return 4 * self.width
        return ((8 * self.width + 2) // 3 + 63) // 64 * 64


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h = cfg.num_heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=False)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        if cos is not None:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        h = cfg.hidden()
        self.fc = nn.Linear(cfg.width, 2 * h if self.swiglu else h, bias=False)
        self.proj = nn.Linear(h, cfg.width, bias=False)

    def forward(self, x):
        h = self.fc(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.proj(h)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class Holder(nn.Module):
    """A container whose children may have any name ("modules" clashes with nn.Module's attribute)."""

    def __init__(self, children):
        super().__init__()
        for name, child in children.items():
            self._modules[name] = child


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tok = nn.Embedding(cfg.vocab_size, cfg.width)
        if cfg.positions == "learned":
            self.embed_pos = nn.Embedding(cfg.context, cfg.width)
        per_level = cfg.num_layers // cfg.num_levels
        # levels.{l}.modules.0.blocks.{b}: the dense model is the path (0, ..., 0)
        self.levels = Holder({
            str(l): Holder({"modules": Holder({"0": Holder({
                "blocks": nn.ModuleList([Block(cfg) for _ in range(per_level)])})})})
            for l in range(cfg.num_levels)})
        self.final_norm = RMSNorm(cfg.width, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        d = cfg.width // cfg.num_heads
        if cfg.positions == "rope":
            inv_freq = cfg.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            angles = torch.outer(torch.arange(cfg.context, dtype=torch.float64), inv_freq)
            full = torch.cat([angles, angles], dim=-1)
            self.register_buffer("rope_cos", full.cos().float(), persistent=False)
            self.register_buffer("rope_sin", full.sin().float(), persistent=False)
        else:
            self.rope_cos = self.rope_sin = None
        self.register_buffer("mask", torch.tril(torch.ones(cfg.context, cfg.context)), persistent=False)

    def blocks(self):
        for l in range(self.cfg.num_levels):
            yield from self.levels._modules[str(l)]._modules["modules"]._modules["0"]._modules["blocks"]

    def forward(self, idx):
        B, T = idx.shape
        x = self.embed_tok(idx)
        if self.cfg.positions == "learned":
            x = x + self.embed_pos.weight[:T]
        cos = self.rope_cos[:T] if self.rope_cos is not None else None
        sin = self.rope_sin[:T] if self.rope_sin is not None else None
        for block in self.blocks():
            x = block(x, cos, sin, self.mask)
        x = self.final_norm(x)
        w = self.embed_tok.weight if self.cfg.tie_embeddings else self.head.weight
        return F.linear(x, w)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
