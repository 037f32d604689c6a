#include "tributary/data/hf_tokenizer.h"

#include <algorithm>
#include <unordered_map>

#include "tributary/core/error.h"

namespace tributary {

namespace {

// A code point as UTF-8.
std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

nlohmann::json added_token(int32_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

nlohmann::json bpe_model(const nlohmann::json& vocab, const nlohmann::json& merges, const nlohmann::json& unk,
                         bool byte_fallback) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", unk},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", !unk.is_null()},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", merges}};
}

nlohmann::json tokenizer_json(nlohmann::json added, nlohmann::json normalizer, nlohmann::json pre_tokenizer,
                              nlohmann::json decoder, nlohmann::json model) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", std::move(normalizer)},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", nullptr},
          {"decoder", std::move(decoder)},
          {"model", std::move(model)}};
}

// Where each UTF-8 character of `s` starts after the first.
std::vector<size_t> char_boundaries(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<uint8_t>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

// SentencePiece's BPE model keeps no merges: a piece's score orders its making. Every split of a piece into two
// pieces is a merge, ranked by the piece's score (highest first), then by the halves' ids.
nlohmann::json implied_merges(const SentencePieceModel& model) {
  using Type = SentencePieceModel::PieceType;
  std::unordered_map<std::string, int32_t> normal;
  for (size_t id = 0; id < model.pieces.size(); ++id)
    if (model.pieces[id].type == Type::kNormal) normal.emplace(model.pieces[id].text, static_cast<int32_t>(id));
  struct Merge {
    int32_t left, right;
    float score;
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < model.pieces.size(); ++id) {
    const auto& p = model.pieces[id];
    if (p.type != Type::kNormal) continue;
    std::vector<Merge> local;
    for (size_t cut : char_boundaries(p.text)) {
      const auto l = normal.find(p.text.substr(0, cut)), r = normal.find(p.text.substr(cut));
      if (l != normal.end() && r != normal.end()) local.push_back({l->second, r->second, p.score});
    }
    std::sort(local.begin(), local.end(),
              [](const Merge& a, const Merge& b) { return std::tie(a.left, a.right) < std::tie(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  nlohmann::json out = nlohmann::json::array();
  for (const Merge& m : merges) out.push_back({model.pieces[m.left].text, model.pieces[m.right].text});
  return out;
}

}  // namespace

// A byte-level BPE without merges, whose vocabulary is GPT-2's printable stand-in for each byte (the ByteLevel
// pre-tokenizer's alphabet) at the byte's own id, and the end of a document as a special added token.
HfTokenizer hf_byte_tokenizer(int32_t eot_id, int64_t max_length) {
  std::vector<uint32_t> stand_in(256, 0);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    stand_in[b] = printable ? b : next++;
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (uint32_t b = 0; b < 256; ++b) vocab[utf8(stand_in[b])] = b;
  const std::string eot = "<|endoftext|>";
  vocab[eot] = eot_id;
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  return {tokenizer_json({added_token(eot_id, eot, true)}, nullptr, byte_level, byte_level,
                         bpe_model(vocab, nlohmann::json::array(), nullptr, false)),
          {{"tokenizer_class", "PreTrainedTokenizerFast"},
           {"eos_token", eot},
           {"model_max_length", max_length},
           {"clean_up_tokenization_spaces", false}}};
}

std::string hf_unsupported(const SentencePieceModel& model) {
  using Kind = SentencePieceModel::Kind;
  if (model.kind != Kind::kBpe && model.kind != Kind::kUnigram)
    return fmt::format("a {} model (only BPE and unigram)", model.kind == Kind::kWord ? "word" : "char");
  if (model.normalizer != "identity")
    return fmt::format("the '{}' normalizer (only 'identity', as data build trains)", model.normalizer);
  if (model.remove_extra_whitespaces) return "remove_extra_whitespaces (data build keeps spaces as they are)";
  if (!model.escape_whitespaces) return "spaces not escaped as '▁'";
  return "";
}

HfTokenizer hf_sentencepiece_tokenizer(const SentencePieceModel& model, int32_t eot_id, int64_t max_length) {
  using Type = SentencePieceModel::PieceType;
  if (const std::string why = hf_unsupported(model); !why.empty())
    fail("no tokenizer.json for a SentencePiece model with {}", why);
  const std::string space = "\u2581";
  nlohmann::json added = nlohmann::json::array();
  for (size_t id = 0; id < model.pieces.size(); ++id) {
    const auto& p = model.pieces[id];
    if (p.type == Type::kControl || p.type == Type::kUnknown || p.type == Type::kUserDefined)
      added.push_back(added_token(static_cast<int32_t>(id), p.text, p.type != Type::kUserDefined));
  }
  nlohmann::json normalizers = nlohmann::json::array();
  if (model.add_dummy_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", space}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}});
  nlohmann::json decoders = {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}}};
  if (model.byte_fallback) decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (model.add_dummy_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});

  const int32_t unk = model.id_of(Type::kUnknown);
  nlohmann::json hf_model;
  if (model.kind == SentencePieceModel::Kind::kBpe) {
    nlohmann::json vocab = nlohmann::json::object();
    for (size_t id = 0; id < model.pieces.size(); ++id) vocab[model.pieces[id].text] = id;
    hf_model = bpe_model(vocab, implied_merges(model), unk >= 0 ? nlohmann::json(model.pieces[unk].text) : nullptr,
                         model.byte_fallback);
  } else {
    nlohmann::json vocab = nlohmann::json::array();
    for (const auto& p : model.pieces) vocab.push_back({p.text, p.score});
    hf_model = {{"type", "Unigram"},
                {"unk_id", unk >= 0 ? nlohmann::json(unk) : nullptr},
                {"vocab", vocab},
                {"byte_fallback", model.byte_fallback}};
  }
  nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                           {"model_max_length", max_length},
                           {"clean_up_tokenization_spaces", false}};
  if (eot_id >= 0 && size_t(eot_id) < model.pieces.size()) config["eos_token"] = model.pieces[eot_id].text;
  if (unk >= 0) config["unk_token"] = model.pieces[unk].text;
  return {tokenizer_json(added, {{"type", "Sequence"}, {"normalizers", normalizers}}, nullptr,
                         {{"type", "Sequence"}, {"decoders", decoders}}, hf_model),
          config};
}

}  // namespace tributary
