// Our tokenizers in the Hugging Face `tokenizers` library's format (tokenizer.json) with the tokenizer_config.json
// that lets transformers' AutoTokenizer load them (as PreTrainedTokenizerFast): it then encodes text to our ids and
// decodes them back. `tributary export --format hf` writes both.
#pragma once

#include <nlohmann/json.hpp>

#include "tributary/data/sentencepiece_model.h"

namespace tributary {

struct HfTokenizer {
  nlohmann::json tokenizer;  // tokenizer.json
  nlohmann::json config;     // tokenizer_config.json
};

// The byte tokenizer (id b < 256 is byte b, `eot_id` ends a document).
HfTokenizer hf_byte_tokenizer(int32_t eot_id, int64_t max_length);

// Why `model` has no tokenizer.json of ours, or "" when it has one: SentencePiece models as `data build` trains them
// (BPE or unigram, the identity normalizer, spaces kept as they are, "▁" for a space).
std::string hf_unsupported(const SentencePieceModel& model);

// A SentencePiece model (hf_unsupported must be ""): BPE with the merges its vocabulary implies (a pair merges in the
// order of the score of the piece it makes, as SentencePiece's BPE encoder does), or unigram with the pieces' scores;
// byte fallback, the dummy prefix and "▁" for a space as the model says; `eot_id` (a document's end) is the eos token.
HfTokenizer hf_sentencepiece_tokenizer(const SentencePieceModel& model, int32_t eot_id, int64_t max_length);

}  // namespace tributary
