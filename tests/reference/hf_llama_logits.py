"""The proof of `tributary export --format hf` with Hugging Face's own code: `transformers.LlamaForCausalLM` loads an
exported directory (offline: nothing is fetched) and computes the logits of the given tokens.

  python3 tests/reference/hf_llama_logits.py --tokens "1,2,3;4,5,6" DIR=logits.f32 [DIR2=logits2.f32 ...]

The tokens are rows of equal length separated by ';'. Each output is the logits (rows, length, vocab_size) of its
directory's model as raw little-endian float32; their shapes are printed on stdout as JSON. Several directories in one
call pay for importing transformers once. The C++ tests compare it with tributary's own forward pass;
nothing here is shared with the C++ code but the files."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="DIR=OUT")
    ap.add_argument("--tokens", required=True, help="rows of comma-separated ids, rows separated by ';'")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    tokens = torch.tensor([[int(t) for t in row.split(",")] for row in args.tokens.split(";")], dtype=torch.int64)
    shapes = {}
    for pair in args.pairs:
        directory, out = pair.rsplit("=", 1)
        # eager attention: the formula as modeling_llama writes it (sdpa would be the same up to rounding)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager",
                                                 local_files_only=True).eval()
        with torch.no_grad():
            logits = model(input_ids=tokens).logits.float().contiguous()
        with open(out, "wb") as f:
            f.write(logits.numpy().astype("<f4").tobytes())
        shapes[directory] = list(logits.shape)
    print(json.dumps({"shapes": shapes, "transformers": __import__("transformers").__version__}))


if __name__ == "__main__":
    main()
