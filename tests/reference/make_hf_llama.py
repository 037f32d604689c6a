"""A random Llama made by Hugging Face's `transformers` (LlamaConfig + save_pretrained: safetensors, in several shards
with model.safetensors.index.json), for `tributary import` to read; also writes transformers' own logits for the given
tokens, which the imported model must reproduce.

  python3 tests/reference/make_hf_llama.py --out DIR [--tokens "1,2,3;4,5,6"] [--variants mha-tied,gqa-untied]
                                           [--vocab 257] [--tokenizer TOKENIZER_DIR]

Each variant ATTENTION-EMBEDDINGS[-FAMILY] (attention mha or gqa: 4 query heads on 4 or 2 key/value heads; tied or
untied embeddings; the family, llama by default:
  llama3   Llama 3.1's RoPE scaling (rope_type llama3, factor 8, original context 16 of 32) and head_dim 16 where
           hidden_size / heads is 8;
  linear   RoPE scaled linearly (rope_type linear, factor 4);
  qwen2    Qwen2ForCausalLM: biases on q, k and v;
  mistral  MistralForCausalLM with a sliding window as long as the context)
becomes the model directory DIR/VARIANT and its logits DIR/VARIANT.f32 (rows, length, 257) as raw little-endian
float32.

Weights are drawn large (std 0.3, norm gains too) so that a misplaced head, row or shard changes the logits by far
more than the tolerance. Beside the weights goes the tokenizer `import` reads: TOKENIZER_DIR's files (tokenizer.json,
tokenizer_config.json, tokenizer.model; --vocab should cover its ids), or a tributary_tokenizer.json of type byte
(vocabulary 257). Without --tokens no logits are written."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402

import torch  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,  # noqa: E402
                          Qwen2ForCausalLM)
from transformers.utils import logging as hf_logging  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="", help="rows of comma-separated ids, rows separated by ';'")
    ap.add_argument("--vocab", type=int, default=257)
    ap.add_argument("--tokenizer", default="",
                    help="a directory whose tokenizer files go beside the weights (one per variant: comma-separated)")
    ap.add_argument("--variants", default="mha-tied,mha-untied,gqa-tied,gqa-untied")
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tokens = (torch.tensor([[int(t) for t in row.split(",")] for row in args.tokens.split(";")], dtype=torch.int64)
              if args.tokens else None)
    made = {}
    variants = args.variants.split(",")
    tokenizers = args.tokenizer.split(",") if "," in args.tokenizer else [args.tokenizer] * len(variants)
    if len(tokenizers) != len(variants):
        ap.error(f"--tokenizer names {len(tokenizers)} directories for {len(variants)} variants")
    for variant, tokenizer in zip(variants, tokenizers):
        attention, embeddings, family = (variant.split("-") + ["llama"])[:3]
        if attention not in ("mha", "gqa") or embeddings not in ("tied", "untied") or family not in FAMILIES:
            ap.error(f"variant '{variant}': expected (mha|gqa)-(tied|untied)[-(llama|llama3|linear|qwen2|mistral)]")
        made[variant] = make(os.path.join(args.out, variant), 2 if attention == "gqa" else 4, embeddings == "untied",
                             tokens, family, args.vocab, tokenizer)
    print(json.dumps(made))


FAMILIES = ("llama", "llama3", "linear", "qwen2", "mistral")


def make(out, kv_heads, untied, tokens, family="llama", vocab=257, tokenizer=""):
    shape = dict(vocab_size=vocab, hidden_size=32, intermediate_size=88, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=kv_heads, max_position_embeddings=32, rms_norm_eps=1e-5,
                 tie_word_embeddings=not untied, hidden_act="silu", attn_implementation="eager")
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(rope_theta=500.0, use_sliding_window=False, **shape)).eval()
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(rope_theta=500.0, sliding_window=32, head_dim=8, **shape)).eval()
    else:
        rope = {"rope_type": "default", "rope_theta": 500.0}
        extra = {}
        if family == "llama3":
            rope = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
            extra = {"head_dim": 16}
        elif family == "linear":
            rope = {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}
        model = LlamaForCausalLM(LlamaConfig(rope_parameters=rope, attention_bias=False, mlp_bias=False, **extra,
                                             **shape)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    # ~40 KB of weights in 16 KB shards: several files and an index, as published checkpoints come
    model.save_pretrained(out, safe_serialization=True, max_shard_size="16KB")
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
            if os.path.exists(os.path.join(tokenizer, name)):
                shutil.copy(os.path.join(tokenizer, name), os.path.join(out, name))
    else:
        with open(os.path.join(out, "tributary_tokenizer.json"), "w") as f:
            json.dump({"type": "byte"}, f)
    if tokens is None:
        return {"shards": sum(n.endswith(".safetensors") for n in os.listdir(out))}
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().contiguous()
    with open(out + ".f32", "wb") as f:
        f.write(logits.numpy().astype("<f4").tobytes())
    return {"shape": list(logits.shape), "shards": sum(n.endswith(".safetensors") for n in os.listdir(out))}


if __name__ == "__main__":
    main()
