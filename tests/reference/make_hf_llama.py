"""A random Llama made by Hugging Face's `transformers` (LlamaConfig + save_pretrained: safetensors, in several shards
with model.safetensors.index.json), for `tributary import` to read; also writes transformers' own logits for the given
tokens, which the imported model must reproduce.

  python3 tests/reference/make_hf_llama.py --out DIR --tokens "1,2,3;4,5,6" [--variants mha-tied,gqa-untied]

Each variant (attention mha or gqa: 4 query heads on 4 or 2 key/value heads; tied or untied embeddings) becomes the
model directory DIR/VARIANT and its logits DIR/VARIANT.f32 (rows, length, 257) as raw little-endian float32.

Weights are drawn large (std 0.3, norm gains too) so that a misplaced head, row or shard changes the logits by far
more than the tolerance. A tributary_tokenizer.json of type byte goes beside the weights (vocabulary 257), since
`import` needs a tokenizer it can read."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", required=True, help="rows of comma-separated ids, rows separated by ';'")
    ap.add_argument("--variants", default="mha-tied,mha-untied,gqa-tied,gqa-untied")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tokens = torch.tensor([[int(t) for t in row.split(",")] for row in args.tokens.split(";")], dtype=torch.int64)
    made = {}
    for variant in args.variants.split(","):
        attention, embeddings = variant.split("-")
        if attention not in ("mha", "gqa") or embeddings not in ("tied", "untied"):
            ap.error(f"variant '{variant}': expected (mha|gqa)-(tied|untied)")
        made[variant] = make(os.path.join(args.out, variant), 2 if attention == "gqa" else 4, embeddings == "untied",
                             tokens)
    print(json.dumps(made))


def make(out, kv_heads, untied, tokens):
    config = LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=88, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=32,
                         rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=not untied,
                         attention_bias=False, mlp_bias=False, hidden_act="silu", attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    # ~40 KB of weights in 16 KB shards: several files and an index, as published checkpoints come
    model.save_pretrained(out, safe_serialization=True, max_shard_size="16KB")
    with open(os.path.join(out, "tributary_tokenizer.json"), "w") as f:
        json.dump({"type": "byte"}, f)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().contiguous()
    with open(out + ".f32", "wb") as f:
        f.write(logits.numpy().astype("<f4").tobytes())
    return {"shape": list(logits.shape), "shards": sum(n.endswith(".safetensors") for n in os.listdir(out))}


if __name__ == "__main__":
    main()
