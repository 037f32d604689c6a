"""The proof of the tokenizer `tributary export --format hf` writes, with Hugging Face's own code:
`transformers.AutoTokenizer` loads the exported directory (offline), encodes the text in the file TEXT and decodes the
ids back. Prints JSON: {"ids": [...], "decoded": "..."}; the C++ test compares the ids with our tokenizer's.

  python3 tests/reference/hf_tokenizer_roundtrip.py DIR TEXT"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json  # noqa: E402
import sys  # noqa: E402

from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


def main():
    hf_logging.set_verbosity_error()
    directory, text_file = sys.argv[1], sys.argv[2]
    text = open(text_file, encoding="utf-8").read()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = tokenizer.encode(text, add_special_tokens=False)
    eot = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
    print(json.dumps({"ids": ids, "decoded": tokenizer.decode(ids), "eos_id": eot,
                      "class": type(tokenizer).__name__}, ensure_ascii=False))


if __name__ == "__main__":
    main()
