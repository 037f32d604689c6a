// A Hugging Face tokenizer.json of the byte-level BPE families (GPT-2, Llama 3.x, Qwen 2/2.5, SmolLM, ...), read and
// applied as the `tokenizers` library does, so that a model's own tokenizer puts a user's text in the model's ids:
//   1. added tokens (special or not) are cut out of the text first, leftmost-longest: those with "normalized": false
//      from the raw text, the others from the normalized text;
//   2. the normalizer: none, or NFC / NFD / NFKC / NFKD (utf8proc), alone or in a Sequence;
//   3. the pre-tokenizer: Split by a regex ("Isolated" or "Removed"; PCRE2 with Unicode properties, which accepts the
//      families' patterns as Oniguruma does) and ByteLevel (its add_prefix_space; with use_regex, GPT-2's pattern),
//      alone or in a Sequence;
//   4. BPE on each piece's bytes: the pair of lowest merge rank first, leftmost among equals; with "ignore_merges" a
//      piece that is a whole vocabulary entry is taken as it is (Llama 3).
// The post-processor is not applied by encode (as add_special_tokens=False): a template that begins with a special
// token (Llama 3's <|begin_of_text|> $A) gives bos_id(), which `data build` puts before every document and `generate`
// before the prompt; every document ends with the end-of-document token. Anything else (another model type, a Metaspace
// pre-tokenizer, lstrip/rstrip added tokens, byte fallback) is refused naming the key, so a tokenizer is either read
// exactly or not at all. Bytes that are not UTF-8 are not normalized and are matched by the regex as single characters
// (`tokenizers` itself accepts only valid text).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tributary/data/tokenizer.h"

namespace tributary {

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads `tokenizer_json` (Error naming the file and key of what it cannot read or does not support). The
  // end-of-document id is `eot_id` when given; otherwise tokenizer_config.json's eos_token beside the file; otherwise
  // the first added special token among <|end_of_text|>, <|endoftext|>, </s>, <|im_end|>, <eos> (an Error if none).
  explicit BpeTokenizer(const fs::path& tokenizer_json, std::optional<int32_t> eot_id = std::nullopt);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  // The bytes of the ids; special tokens are left out, as `tokenizers` decodes by default (skip_special_tokens).
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;  // one past the largest id of the vocabulary and the added tokens
  int32_t eot_id() const override;
  std::optional<int32_t> bos_id() const override;
  std::string kind() const override { return "bpe"; }

  // The id of a vocabulary entry or added token given as its text, or nullopt.
  std::optional<int32_t> id_of(const std::string& token) const;
  // An added token's text, or a vocabulary entry's bytes ("" for an id it does not have).
  std::string token_text(int32_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tributary
