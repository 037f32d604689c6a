"""PyTorch eager (Python) training-step throughput on the same model, batch and thread count as bench_train.cpp.
Prints one JSON object. Usage: python3 bench/torch_eager.py [--steps=N] [--compile=1] KEY=VALUE ... (keys as in the
C++ config; train.device=cuda runs on the GPU). --compile=1 wraps the model in torch.compile (PyTorch 2.x) and
warms up long enough for it to finish compiling."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from model import Config, Transformer, loss_fn  # noqa: E402

MODEL_KEYS = set(Config().__dict__)


def main():
    cfg_args, batch, threads, steps, warmup, device, compile_model = {}, 16, 0, 10, 2, "cpu", False
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
    torch.set_num_threads(threads if threads > 0 else os.cpu_count())
    cfg_args.setdefault("vocab_size", 257)
    cfg = Config(**cfg_args)
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    T = cfg.context
    tokens = torch.randint(0, cfg.vocab_size, (batch, T + 1)).to(device)
    forward = torch.compile(model) if compile_model else model
    if compile_model:
        warmup = max(warmup, 5)  # the first calls compile (forward and backward graphs)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(forward(tokens[:, :T]), tokens[:, 1:])
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
                      "threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device)}))


if __name__ == "__main__":
    main()
