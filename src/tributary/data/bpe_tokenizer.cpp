#include "tributary/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "tributary/core/error.h"

namespace tributary {

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer pattern: what ByteLevel splits by when its use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, inverted: the byte each printable code point of a byte-level vocabulary stands for
// (printable bytes stand for themselves, the others for 256, 257, ... in byte order). Built once.
const std::unordered_map<uint32_t, uint8_t>& byte_of_code_point() {
  static const std::unordered_map<uint32_t, uint8_t> table = [] {
    std::unordered_map<uint32_t, uint8_t> t;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[printable ? uint32_t(b) : next++] = uint8_t(b);
    }
    return t;
  }();
  return table;
}

// The raw bytes a byte-level vocabulary entry stands for, or nullopt if one of its characters stands for no byte.
std::optional<std::string> entry_bytes(const std::string& entry) {
  const auto& byte_of = byte_of_code_point();
  std::string out;
  const auto* s = reinterpret_cast<const utf8proc_uint8_t*>(entry.data());
  for (utf8proc_ssize_t at = 0; at < utf8proc_ssize_t(entry.size());) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(s + at, utf8proc_ssize_t(entry.size()) - at, &cp);
    if (n <= 0) return std::nullopt;
    const auto it = byte_of.find(uint32_t(cp));
    if (it == byte_of.end()) return std::nullopt;
    out.push_back(char(it->second));
    at += n;
  }
  return out;
}

struct Pcre2Code {
  pcre2_code* code = nullptr;
  ~Pcre2Code() { pcre2_code_free(code); }
};

struct Merge {
  int32_t rank, id;
};

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

}  // namespace

struct BpeTokenizer::Impl {
  fs::path file;
  std::unordered_map<std::string, int32_t> vocab;  // a vocabulary entry's raw bytes -> its id
  std::vector<std::string> bytes_of;               // id -> what decode writes for it
  std::vector<bool> special;                       // id -> an added special token (decode leaves it out)
  std::array<int32_t, 256> byte_id{};              // a single byte's id, -1 if the vocabulary lacks it
  std::unordered_map<uint64_t, Merge> merges;      // (left id, right id) -> rank and merged id
  bool ignore_merges = false;
  std::optional<int32_t> unk;

  struct Added {
    std::string content;
    int32_t id;
  };
  // Added tokens, longest first, indexed by their first byte: a text is searched for them at every position (Llama 3
  // has 256, all beginning with '<').
  struct AddedSet {
    std::vector<Added> tokens;
    std::array<std::vector<size_t>, 256> by_first;
    void index() {
      std::stable_sort(tokens.begin(), tokens.end(),
                       [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
      for (size_t i = 0; i < tokens.size(); ++i) by_first[uint8_t(tokens[i].content[0])].push_back(i);
    }
  };
  AddedSet added_raw, added_normalized;
  std::unordered_map<std::string, int32_t> added_ids;

  int normalize_options = 0;  // utf8proc options, 0 for none

  struct PreStep {
    std::shared_ptr<Pcre2Code> regex;  // null: no split (ByteLevel without its regex)
    bool removed = false;              // "Removed": the matches are dropped; "Isolated": each is a piece of its own
    bool add_prefix_space = false;
  };
  std::vector<PreStep> pre;

  int32_t eot = -1;
  std::optional<int32_t> bos;
  int64_t size = 0;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  [[noreturn]] void bad(const std::string& key, const std::string& why) const {
    fail("{}: {}: {}", file.string(), key, why);
  }

  std::shared_ptr<Pcre2Code> compile(const std::string& pattern, const std::string& key) const {
    int code = 0;
    PCRE2_SIZE offset = 0;
    auto out = std::make_shared<Pcre2Code>();
    out->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
    if (!out->code) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(code, message.data(), message.size());
      bad(key, fmt::format("the pattern does not compile at offset {}: {}", offset,
                           reinterpret_cast<const char*>(message.data())));
    }
    pcre2_jit_compile(out->code, PCRE2_JIT_COMPLETE);  // an interpreter is the fallback where JIT is missing
    return out;
  }

  void read_normalizer(const Json& j, const std::string& key) {
    if (j.is_null()) return;
    const std::string type = j.value("type", "");
    if (type == "Sequence") {
      const auto& steps = j.at("normalizers");
      for (size_t i = 0; i < steps.size(); ++i) read_normalizer(steps[i], fmt::format("{}.normalizers[{}]", key, i));
      return;
    }
    int options = 0;
    if (type == "NFC")
      options = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (type == "NFD")
      options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (type == "NFKC")
      options = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (type == "NFKD")
      options = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
      bad(key, fmt::format("normalizer '{}' is not supported (none, NFC, NFD, NFKC or NFKD)", type));
    if (normalize_options != 0 && normalize_options != options)
      bad(key, "two different Unicode normalizations in one Sequence are not supported");
    normalize_options = options;
  }

  void read_pre_tokenizer(const Json& j, const std::string& key) {
    if (j.is_null()) return;
    const std::string type = j.value("type", "");
    if (type == "Sequence") {
      const auto& steps = j.at("pretokenizers");
      for (size_t i = 0; i < steps.size(); ++i)
        read_pre_tokenizer(steps[i], fmt::format("{}.pretokenizers[{}]", key, i));
    } else if (type == "Split") {
      if (j.value("invert", false)) bad(key + ".invert", "an inverted Split is not supported");
      const std::string behavior = j.value("behavior", "");
      if (behavior != "Isolated" && behavior != "Removed")
        bad(key + ".behavior", fmt::format("'{}' is not supported (Isolated or Removed)", behavior));
      const auto& pattern = j.at("pattern");
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = pattern.at("Regex").get<std::string>();
      } else {
        // A plain string splits where it occurs: as a pattern, every character taken literally.
        regex = "\\Q" + pattern.at("String").get<std::string>() + "\\E";
      }
      pre.push_back({.regex = compile(regex, key + ".pattern"), .removed = behavior == "Removed"});
    } else if (type == "ByteLevel") {
      pre.push_back({.regex = j.value("use_regex", true) ? compile(kGpt2Pattern, key) : nullptr,
                     .add_prefix_space = j.value("add_prefix_space", false)});
    } else {
      bad(key, fmt::format("pre-tokenizer '{}' is not supported (Split, ByteLevel or a Sequence of them): a "
                           "SentencePiece-style tokenizer is read from its tokenizer.model",
                           type));
    }
  }

  void read_model(const Json& m) {
    if (m.value("type", "") != "BPE")
      bad("model.type", fmt::format("'{}' is not supported (byte-level BPE)", m.value("type", "")));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
      if (m.contains(key) && !m[key].is_null()) bad(std::string("model.") + key, "must be null for byte-level BPE");
    if (m.value("byte_fallback", false)) bad("model.byte_fallback", "byte fallback is not supported (byte-level BPE)");
    ignore_merges = m.value("ignore_merges", false);
    byte_id.fill(-1);
    for (const auto& [entry, id_json] : m.at("vocab").items()) {
      const int64_t id = id_json.get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 24)) bad("model.vocab", fmt::format("'{}' has id {}", entry, id));
      if (int64_t(bytes_of.size()) <= id) bytes_of.resize(size_t(id) + 1);
      // An entry that stands for no bytes (not byte-level) decodes as its own text and is never produced by BPE.
      const auto raw = entry_bytes(entry);
      bytes_of[size_t(id)] = raw ? *raw : entry;
      if (!raw) continue;
      vocab[*raw] = int32_t(id);
      if (raw->size() == 1) byte_id[uint8_t((*raw)[0])] = int32_t(id);
    }
    const auto& list = m.at("merges");
    for (size_t rank = 0; rank < list.size(); ++rank) {
      const auto& merge = list[rank];
      std::string left, right;
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          bad(fmt::format("model.merges[{}]", rank), fmt::format("'{}' is not two entries separated by a space", s));
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        if (!merge.is_array() || merge.size() != 2) bad(fmt::format("model.merges[{}]", rank), "not a pair");
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      }
      const auto l = entry_bytes(left), r = entry_bytes(right);
      const auto find = [&](const std::optional<std::string>& raw) -> int32_t {
        if (!raw) return -1;
        const auto it = vocab.find(*raw);
        return it == vocab.end() ? -1 : it->second;
      };
      const int32_t li = find(l), ri = find(r), mi = l && r ? find(*l + *r) : -1;
      if (li < 0 || ri < 0 || mi < 0)
        bad(fmt::format("model.merges[{}]", rank),
            fmt::format("'{}' + '{}' names an entry the vocabulary does not hold", left, right));
      merges.emplace(pair_key(li, ri), Merge{int32_t(rank), mi});  // the first (lowest) rank of a pair wins
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto raw = entry_bytes(m["unk_token"].get<std::string>());
      if (raw && vocab.count(*raw)) unk = vocab.at(*raw);
    }
  }

  void read_added(const Json& list) {
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& t = list[i];
      const std::string key = fmt::format("added_tokens[{}]", i);
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (t.value(flag, false)) bad(key + "." + flag, "true is not supported");
      const int64_t id = t.at("id").get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 24)) bad(key + ".id", fmt::format("{} is out of range", id));
      Added added{t.at("content").get<std::string>(), int32_t(id)};
      if (added.content.empty()) bad(key + ".content", "empty");
      if (int64_t(bytes_of.size()) <= id) bytes_of.resize(size_t(id) + 1);
      bytes_of[size_t(id)] = added.content;
      if (t.value("special", false)) {
        special.resize(bytes_of.size());
        special[size_t(id)] = true;
      }
      added_ids[added.content] = added.id;
      (t.value("normalized", false) && normalize_options != 0 ? added_normalized : added_raw).tokens.push_back(added);
    }
    added_raw.index();
    added_normalized.index();
  }

  void choose_eot(std::optional<int32_t> given) {
    if (given) {
      eot = *given;
      return;
    }
    const fs::path config = file.parent_path() / "tokenizer_config.json";
    std::error_code ec;
    if (fs::is_regular_file(config, ec)) {
      const auto j = Json::parse(read_file(config), nullptr, false);
      if (j.is_object() && j.contains("eos_token")) {
        const auto& eos = j["eos_token"];
        const std::string name = eos.is_string()                              ? eos.get<std::string>()
                                 : eos.is_object() && eos.contains("content") ? eos["content"].get<std::string>()
                                                                              : std::string();
        const auto it = added_ids.find(name);
        if (it == added_ids.end())
          fail("{}: eos_token '{}' is not an added token of '{}'", config.string(), name, file.string());
        eot = it->second;
        return;
      }
    }
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>"})
      if (const auto it = added_ids.find(name); it != added_ids.end()) {
        eot = it->second;
        return;
      }
    fail(
        "{}: no end-of-document token (no tokenizer_config.json with eos_token beside it, and none of "
        "<|end_of_text|>, <|endoftext|>, </s>, <|im_end|>, <eos> among its added tokens): add tokenizer_config.json",
        file.string());
  }

  // A TemplateProcessing (alone or in a Sequence) whose single-sequence template begins with a special token.
  void read_post_processor(const Json& j, const std::string& key) {
    if (j.is_null()) return;
    const std::string type = j.value("type", "");
    if (type == "Sequence") {
      const auto& steps = j.at("processors");
      for (size_t i = 0; i < steps.size(); ++i) read_post_processor(steps[i], fmt::format("{}.processors[{}]", key, i));
      return;
    }
    if (type != "TemplateProcessing") return;  // ByteLevel's offsets and the like change no id
    const auto& single = j.at("single");
    if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) return;
    const std::string name = single[0]["SpecialToken"].at("id").get<std::string>();
    const auto& specials = j.value("special_tokens", Json::object());
    if (specials.contains(name) && specials[name].contains("ids") && !specials[name]["ids"].empty()) {
      bos = specials[name]["ids"][0].get<int32_t>();
    } else if (const auto it = added_ids.find(name); it != added_ids.end()) {
      bos = it->second;
    } else {
      bad(key + ".single[0]", fmt::format("'{}' is no token of this tokenizer", name));
    }
  }

  // `text` normalized (as it is when normalization fails: not UTF-8).
  std::string normalize(std::string_view text) const {
    if (normalize_options == 0 || text.empty()) return std::string(text);
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                            utf8proc_ssize_t(text.size()), &out, utf8proc_option_t(normalize_options));
    if (n < 0) return std::string(text);
    std::string result(reinterpret_cast<const char*>(out), size_t(n));
    std::free(out);
    return result;
  }

  // Cuts `text` at the added tokens of `tokens` (leftmost, longest): `plain` for the text between, `token` for each.
  template <typename Plain>
  void cut_added(std::string_view text, const AddedSet& added, Plain&& plain, std::vector<int32_t>& ids) const {
    size_t start = 0;
    for (size_t at = 0; at < text.size() && !added.tokens.empty();) {
      const Added* found = nullptr;
      for (const size_t i : added.by_first[uint8_t(text[at])])
        if (text.compare(at, added.tokens[i].content.size(), added.tokens[i].content) == 0) {
          found = &added.tokens[i];
          break;
        }
      if (!found) {
        ++at;
        continue;
      }
      if (at > start) plain(text.substr(start, at - start));
      ids.push_back(found->id);
      at += found->content.size();
      start = at;
    }
    if (start < text.size()) plain(text.substr(start));
  }

  void pre_tokenize(std::vector<std::string>& pieces, pcre2_match_data* match) const {
    for (const auto& step : pre) {
      std::vector<std::string> next;
      for (auto& piece : pieces) {
        if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
        if (!step.regex) {
          next.push_back(std::move(piece));
          continue;
        }
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
        size_t at = 0, gap = 0;
        while (at <= piece.size()) {
          const int rc = pcre2_match(step.regex->code, subject, piece.size(), at, 0, match, nullptr);
          if (rc < 0) break;
          const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
          const size_t begin = ov[0], end = ov[1];
          if (begin > gap) next.push_back(piece.substr(gap, begin - gap));
          if (end > begin && !step.removed) next.push_back(piece.substr(begin, end - begin));
          if (end == begin) {
            // An empty match: step over one character (its UTF-8 length) so that the search moves on.
            at = end + 1;
            while (at < piece.size() && (uint8_t(piece[at]) & 0xC0) == 0x80) ++at;
            gap = begin;
            continue;
          }
          at = gap = end;
        }
        if (gap < piece.size()) next.push_back(piece.substr(gap));
      }
      pieces = std::move(next);
    }
  }

  // BPE over one piece's bytes, as `tokenizers`' Word::merge_all: a queue of (rank, position) merges, the lowest
  // rank first, then the leftmost; a popped merge whose pair has changed since it was queued is skipped.
  void merge_piece(const std::string& piece, std::vector<int32_t>& ids) const {
    if (ignore_merges)
      if (const auto it = vocab.find(piece); it != vocab.end()) {
        ids.push_back(it->second);
        return;
      }
    struct Symbol {
      int32_t id;
      int prev, next;
      bool alive;
    };
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    for (const char c : piece) {
      const int32_t id = byte_id[uint8_t(c)];
      if (id < 0) {
        if (unk) symbols.push_back({*unk, 0, 0, true});
        continue;  // as `tokenizers`: a byte the vocabulary lacks is dropped without an unknown token
      }
      symbols.push_back({id, 0, 0, true});
    }
    const int n = int(symbols.size());
    for (int i = 0; i < n; ++i) {
      symbols[size_t(i)].prev = i - 1;
      symbols[size_t(i)].next = i + 1 < n ? i + 1 : -1;
    }
    struct Queued {
      int32_t rank;
      int pos;
      int32_t id;
      bool operator>(const Queued& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Queued, std::vector<Queued>, std::greater<>> queue;
    const auto push = [&](int left) {
      const int right = symbols[size_t(left)].next;
      if (right < 0) return;
      const auto it = merges.find(pair_key(symbols[size_t(left)].id, symbols[size_t(right)].id));
      if (it != merges.end()) queue.push({it->second.rank, left, it->second.id});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!queue.empty()) {
      const Queued top = queue.top();
      queue.pop();
      Symbol& left = symbols[size_t(top.pos)];
      if (!left.alive || left.next < 0) continue;
      const auto it = merges.find(pair_key(left.id, symbols[size_t(left.next)].id));
      if (it == merges.end() || it->second.id != top.id || it->second.rank != top.rank) continue;
      Symbol& right = symbols[size_t(left.next)];
      left.id = top.id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
      if (left.prev >= 0) push(left.prev);
      push(top.pos);
    }
    for (const auto& s : symbols)
      if (s.alive) ids.push_back(s.id);
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& ids, pcre2_match_data* match) const {
    std::vector<std::string> pieces{std::string(text)};
    pre_tokenize(pieces, match);
    for (const auto& piece : pieces) {
      if (piece.size() > 256) {  // long runs are rare; they stay out of the cache
        merge_piece(piece, ids);
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(cache_mutex);
        if (const auto it = cache.find(piece); it != cache.end()) {
          ids.insert(ids.end(), it->second.begin(), it->second.end());
          continue;
        }
      }
      const size_t first = ids.size();
      merge_piece(piece, ids);
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (cache.size() < (size_t{1} << 20))
        cache.emplace(piece, std::vector<int32_t>(ids.begin() + long(first), ids.end()));
    }
  }
};

BpeTokenizer::BpeTokenizer(const fs::path& tokenizer_json, std::optional<int32_t> eot_id)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.file = tokenizer_json;
  const auto j = Json::parse(read_file(tokenizer_json), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail("{}: not a JSON object (a Hugging Face tokenizer.json)", m.file.string());
  if (!j.contains("model")) m.bad("model", "missing: not a Hugging Face tokenizer.json");
  try {
    m.read_normalizer(j.value("normalizer", Json()), "normalizer");
    m.read_pre_tokenizer(j.value("pre_tokenizer", Json()), "pre_tokenizer");
    m.read_model(j.at("model"));
    m.read_added(j.value("added_tokens", Json::array()));
    m.read_post_processor(j.value("post_processor", Json()), "post_processor");
    const Json decoder = j.value("decoder", Json());
    if (!decoder.is_null() && decoder.value("type", "") != "ByteLevel")
      m.bad("decoder", fmt::format("'{}' is not supported (ByteLevel)", decoder.value("type", "")));
  } catch (const Json::exception& e) {
    fail("{}: a key is missing or of another type ({})", m.file.string(), e.what());
  }
  if (m.vocab.empty()) m.bad("model.vocab", "empty");
  m.size = int64_t(m.bytes_of.size());
  m.special.resize(m.bytes_of.size());
  m.choose_eot(eot_id);
  if (m.eot < 0 || m.eot >= m.size) fail("{}: end-of-document id {} is not one of its ids", m.file.string(), m.eot);
  if (m.bos && (*m.bos < 0 || *m.bos >= m.size))
    fail("{}: post_processor's first token has id {}, not one of its ids", m.file.string(), *m.bos);
}

BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  const auto normalized_part = [&](std::string_view raw) {
    const std::string normal = m.normalize(raw);
    m.cut_added(normal, m.added_normalized, [&](std::string_view plain) { m.encode_plain(plain, ids, match); }, ids);
  };
  m.cut_added(text, m.added_raw, normalized_part, ids);
  pcre2_match_data_free(match);
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids)
    if (id >= 0 && id < impl_->size && !impl_->special[size_t(id)]) out += impl_->bytes_of[size_t(id)];
  return out;
}

std::string BpeTokenizer::token_text(int32_t id) const {
  return id >= 0 && id < impl_->size ? impl_->bytes_of[size_t(id)] : std::string();
}

int64_t BpeTokenizer::vocab_size() const { return impl_->size; }
int32_t BpeTokenizer::eot_id() const { return impl_->eot; }
std::optional<int32_t> BpeTokenizer::bos_id() const { return impl_->bos; }

std::optional<int32_t> BpeTokenizer::id_of(const std::string& token) const {
  if (const auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  const auto raw = entry_bytes(token);
  if (!raw) return std::nullopt;
  const auto it = impl_->vocab.find(*raw);
  return it == impl_->vocab.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

}  // namespace tributary
