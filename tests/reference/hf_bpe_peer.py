"""Hugging Face's `tokenizers` (the Rust library, from PyPI) as the peer of our tokenizer.json reader
(src/tributary/data/bpe_tokenizer.h).

  python3 tests/reference/hf_bpe_peer.py train --corpus DOCS.jsonl --out DIR [--vocab 2000] [--families gpt2,llama3,qwen2]
  python3 tests/reference/hf_bpe_peer.py encode --tokenizer DIR/tokenizer.json --corpus DOCS.jsonl --out IDS

`train` makes one tokenizer per family under DIR/FAMILY (tokenizer.json + tokenizer_config.json naming its eos
token), each shaped as that family's published tokenizer.json is:
  gpt2    ByteLevel pre-tokenizer with GPT-2's regex, <|endoftext|>;
  llama3  Split by Llama 3's regex (digits in threes) + ByteLevel without regex, ignore_merges, <|begin_of_text|>,
          <|end_of_text|> and reserved special tokens, a BOS template;
  qwen2   NFC normalizer, Split by Qwen 2's regex (single digits) + ByteLevel, <|endoftext|>, <|im_start|>, <|im_end|>.
`encode` writes the ids of every document (each line of DOCS.jsonl: {"text": ...}) as little-endian int32 to IDS and
each document's count to IDS.lens, without the template's special tokens (add_special_tokens=False), and prints the
time encoding took on one thread as JSON."""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")


def documents(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def make(family, vocab):
    if family == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials, eos = ["<|endoftext|>"], "<|endoftext|>"
    elif family == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(6)]
        eos = "<|end_of_text|>"
    elif family == "qwen2":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        specials, eos = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>"
    else:
        raise SystemExit(f"unknown family '{family}' (gpt2, llama3, qwen2)")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok, trainer, eos


def train(args):
    docs = documents(args.corpus)
    made = {}
    for family in args.families.split(","):
        tok, trainer, eos = make(family, args.vocab)
        tok.train_from_iterator(docs, trainer)
        if family == "llama3":
            tok.post_processor = processors.TemplateProcessing(
                single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
        out = os.path.join(args.out, family)
        os.makedirs(out, exist_ok=True)
        tok.save(os.path.join(out, "tokenizer.json"))
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
        made[family] = {"vocab": tok.get_vocab_size(), "eos": tok.token_to_id(eos)}
    print(json.dumps(made))


def encode(args):
    tok = Tokenizer.from_file(args.tokenizer)
    docs = documents(args.corpus)
    start = time.perf_counter()
    encodings = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    seconds = time.perf_counter() - start
    with open(args.out, "wb") as ids, open(args.out + ".lens", "wb") as lens:
        for e in encodings:
            ids.write(b"".join(int(i).to_bytes(4, "little", signed=True) for i in e))
            lens.write(len(e).to_bytes(4, "little", signed=True))
    print(json.dumps({"seconds": seconds, "documents": len(docs), "bytes": sum(len(d.encode()) for d in docs),
                      "tokens": sum(len(e) for e in encodings)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--corpus", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--vocab", type=int, default=2000)
    t.add_argument("--families", default="gpt2,llama3,qwen2")
    e = sub.add_parser("encode")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--corpus", required=True)
    e.add_argument("--out", required=True)
    args = ap.parse_args()
    train(args) if args.command == "train" else encode(args)


if __name__ == "__main__":
    main()
