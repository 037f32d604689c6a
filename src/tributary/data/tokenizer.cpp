#include "tributary/data/tokenizer.h"

#include "tributary/data/dataset.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
  return out;
}

namespace {

// The sentencepiece shim (see spm_shim.cpp for why it is loaded at run time).
struct SpmApi {
  void* (*load)(const char*, char*, size_t);
  void (*free_handle)(void*);
  int (*vocab_size)(void*);
  int (*eos_id)(void*);
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t);
  int (*decode)(void*, const int*, size_t, char**, size_t*, char*, size_t);
  int (*train)(const char*, char*, size_t);
  void (*free_buffer)(void*);  // buffers from encode/decode belong to the shim's allocator
};

const SpmApi& spm_api() {
  static const SpmApi api = [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("TRIBUTARY_SPM_SHIM")) candidates.emplace_back(env);
    char exe[4096];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      exe[n] = '\0';
      candidates.push_back((fs::path(exe).parent_path() / "libtributary_spm.so").string());
    }
#ifdef TRIBUTARY_SPM_SHIM_PATH
    candidates.emplace_back(TRIBUTARY_SPM_SHIM_PATH);
#endif
    void* lib = nullptr;
    for (const auto& c : candidates)
      if ((lib = ::dlmopen(LM_ID_NEWLM, c.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib)
      fail(
          "SentencePiece support is unavailable: cannot load libtributary_spm.so next to the executable ({}); "
          "rebuild with ./run setup",
          ::dlerror());
    auto sym = [&](const char* name) {
      void* p = ::dlsym(lib, name);
      if (!p) fail("libtributary_spm.so lacks symbol {}; rebuild with ./run setup", name);
      return p;
    };
    SpmApi a;
    a.load = reinterpret_cast<decltype(a.load)>(sym("trib_spm_load"));
    a.free_handle = reinterpret_cast<decltype(a.free_handle)>(sym("trib_spm_free"));
    a.vocab_size = reinterpret_cast<decltype(a.vocab_size)>(sym("trib_spm_vocab_size"));
    a.eos_id = reinterpret_cast<decltype(a.eos_id)>(sym("trib_spm_eos_id"));
    a.encode = reinterpret_cast<decltype(a.encode)>(sym("trib_spm_encode"));
    a.decode = reinterpret_cast<decltype(a.decode)>(sym("trib_spm_decode"));
    a.train = reinterpret_cast<decltype(a.train)>(sym("trib_spm_train"));
    a.free_buffer = reinterpret_cast<decltype(a.free_buffer)>(sym("trib_spm_free_buffer"));
    return a;
  }();
  return api;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  void* handle = nullptr;
  int64_t vocab = 0;
  int32_t eos = -1;
  ~Impl() {
    if (handle) spm_api().free_handle(handle);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const fs::path& model_file) : impl_(std::make_unique<Impl>()) {
  char err[512] = {0};
  impl_->handle = spm_api().load(model_file.c_str(), err, sizeof(err));
  if (!impl_->handle) fail("cannot load SentencePiece model '{}': {}", model_file.string(), err);
  impl_->vocab = spm_api().vocab_size(impl_->handle);
  impl_->eos = spm_api().eos_id(impl_->handle);
  if (impl_->eos < 0)
    fail("SentencePiece model '{}' has no end-of-sentence piece; train it with an eos id", model_file.string());
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  char err[512] = {0};
  int* ids = nullptr;
  size_t n = 0;
  if (spm_api().encode(impl_->handle, text.data(), text.size(), &ids, &n, err, sizeof(err)) != 0)
    fail("SentencePiece encode failed: {}", err);
  std::vector<int32_t> out(ids, ids + n);
  spm_api().free_buffer(ids);
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> in;
  for (int32_t id : ids)
    if (id != eot_id() && id >= 0 && id < vocab_size()) in.push_back(id);
  char err[512] = {0};
  char* text = nullptr;
  size_t len = 0;
  if (spm_api().decode(impl_->handle, in.data(), in.size(), &text, &len, err, sizeof(err)) != 0)
    fail("SentencePiece decode failed: {}", err);
  std::string out(text, len);
  spm_api().free_buffer(text);
  return out;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->vocab; }
int32_t SentencePieceTokenizer::eot_id() const { return impl_->eos; }

void train_sentencepiece(const std::vector<std::string_view>& texts, const fs::path& out_prefix,
                         const SentencePieceOptions& options) {
  // Train from a newline-separated sample file: the library's input is files of sentences.
  fs::path sample = out_prefix;
  sample += ".train.txt";
  {
    std::string buffer;
    for (auto t : texts) {
      if (static_cast<int64_t>(buffer.size()) >= options.max_training_bytes) break;
      buffer.append(t.substr(0, std::min<size_t>(t.size(), 1 << 16)));
      buffer.push_back('\n');
    }
    write_file(sample, buffer, /*sync=*/false);
  }
  std::string args = fmt::format(
      "--input={} --model_prefix={} --vocab_size={} --model_type={} --character_coverage=1.0 --byte_fallback=true "
      "--max_sentence_length=65536 --normalization_rule_name=identity --remove_extra_whitespaces=false "
      "--split_by_whitespace=true --pad_id=-1 --unk_id=0 --bos_id=-1 --eos_id=1 "
      "--minloglevel=2 --num_threads=2",
      sample.string(), out_prefix.string(), options.vocab_size, options.model_type);
  char err[512] = {0};
  int rc = spm_api().train(args.c_str(), err, sizeof(err));
  fs::remove(sample);
  if (rc != 0) fail("SentencePiece training failed ({}); try a smaller --vocab-size or more text", err);
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& dataset_dir) {
  fs::path meta = dataset_dir / "dataset.json";
  if (!fs::exists(meta)) fail_not_a_dataset(dataset_dir);
  auto spec = nlohmann::json::parse(read_file(meta), nullptr, false);
  if (spec.is_discarded() || !spec.contains("tokenizer")) fail("'{}' is corrupt: no tokenizer entry", meta.string());
  std::string kind = spec["tokenizer"].value("kind", "");
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "sentencepiece")
    return std::make_unique<SentencePieceTokenizer>(dataset_dir / spec["tokenizer"].value("model", "tokenizer.model"));
  fail("'{}': unknown tokenizer kind '{}' (expected byte or sentencepiece)", meta.string(), kind);
}

}  // namespace tributary
