// A SentencePiece model file (`tokenizer.model`, a serialized sentencepiece.ModelProto) read without
// libsentencepiece: its pieces with their scores and types, and the trainer and normalizer settings that decide how
// text becomes pieces. What a Hugging Face tokenizer.json of the same model needs (data/hf_tokenizer.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tributary {

struct SentencePieceModel {
  enum class Kind { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };  // TrainerSpec.model_type
  enum class PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  struct Piece {
    std::string text;
    float score = 0;
    PieceType type = PieceType::kNormal;
  };

  std::vector<Piece> pieces;  // in id order
  Kind kind = Kind::kUnigram;
  bool byte_fallback = false;
  std::string normalizer = "nmt_nfkc";  // NormalizerSpec.name ("identity": text is not rewritten)
  bool add_dummy_prefix = true;         // a "▁" before the text
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;  // spaces become "▁"

  // Error naming `what` when the bytes are not a ModelProto.
  static SentencePieceModel parse(std::string_view bytes, const std::string& what);
  int32_t id_of(PieceType type) const;  // the first piece of that type, or -1
};

}  // namespace tributary
