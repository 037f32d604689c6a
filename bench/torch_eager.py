"""PyTorch eager (Python) training-step throughput on the same model, batch and thread count as bench_train.cpp.
Prints one JSON object. Usage: python3 bench/torch_eager.py [--steps=N] [--compile=1] KEY=VALUE ... (keys as in the
C++ config; train.device=cuda runs on the GPU; train.precision=bf16 runs the forward pass under torch.autocast(bf16)
with the loss on fp32 logits, as the C++ trainer does). --compile=1 wraps the model in torch.compile (PyTorch 2.x) and
warms up long enough for it to finish compiling. On a GPU the peer is what a GPU user writes: attention through
F.scaled_dot_product_attention (flash) and torch.optim.AdamW(fused=True)."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
import model as reference  # noqa: E402
from model import Config, Transformer, loss_fn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MODEL_KEYS = set(Config().__dict__)


def sdpa_forward(self, x, cos, sin, mask):
    """The reference attention with F.scaled_dot_product_attention in place of the materialized (T, T) scores."""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=2)
    q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
    if cos is not None:
        q = q * cos + reference.rotate_half(q) * sin
        k = k * cos + reference.rotate_half(k) * sin
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def main():
    cfg_args, batch, threads, steps, warmup, device, compile_model = {}, 16, 0, 10, 2, "cpu", False
    bf16 = False
    for arg in sys.argv[1:]:
        key, value = arg.split("=", 1)
        if key == "--steps":
            steps = int(value)
            continue
        if key == "--compile":
            compile_model = value not in ("0", "false", "")
            continue
        section, name = key.split(".", 1)
        if section == "model" and name in MODEL_KEYS:
            default = Config().__dict__[name]
            cfg_args[name] = (value.lower() == "true") if isinstance(default, bool) else type(default)(value.strip('"'))
        elif key == "train.batch_size":
            batch = int(value)
        elif key == "train.threads":
            threads = int(value)
        elif key == "train.device":
            device = value.strip('"')
        elif key == "train.precision":
            bf16 = value.strip('"') == "bf16"
    torch.set_num_threads(threads if threads > 0 else os.cpu_count())
    cfg_args.setdefault("vocab_size", 257)
    cfg = Config(**cfg_args)
    on_gpu = str(device).startswith("cuda")
    if on_gpu:
        reference.Attention.forward = sdpa_forward
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=on_gpu)
    T = cfg.context
    tokens = torch.randint(0, cfg.vocab_size, (batch, T + 1)).to(device)
    forward = torch.compile(model) if compile_model else model
    if compile_model:
        warmup = max(warmup, 5)  # the first calls compile (forward and backward graphs)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            logits = forward(tokens[:, :T])
        loss = loss_fn(logits.float(), tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # synchronizes with the device

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"impl": "pytorch-compile" if compile_model else "pytorch-eager", "tokens_per_s": batch * T / median, "step_s_median": median,
                      "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device),
                      "precision": "bf16" if bf16 else "fp32"}))


if __name__ == "__main__":
    main()
