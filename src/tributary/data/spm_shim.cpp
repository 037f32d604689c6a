// C ABI around libsentencepiece, built as its own shared object and loaded with dlmopen(LM_ID_NEWLM).
// Why: Debian's libsentencepiece embeds a private protobuf 3.14 whose exported symbols clash with the protobuf 3.21
// that LibTorch pulls in (via onnx): linking both into one executable crashes during static initialisation, a plain
// dlopen fails protobuf's version check, and RTLD_DEEPBIND breaks libstdc++'s iostreams. A separate link-map
// namespace gives sentencepiece its own copies of everything. Memory crosses the boundary only through
// trib_spm_free_buffer (each namespace has its own allocator).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
void set_error(char* err, size_t len, const std::string& message) {
  if (err && len > 0) {
    std::strncpy(err, message.c_str(), len - 1);
    err[len - 1] = '\0';
  }
}
}  // namespace

extern "C" {

void* trib_spm_load(const char* model_path, char* err, size_t err_len) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  auto status = p->Load(model_path);
  if (!status.ok()) {
    set_error(err, err_len, status.ToString());
    delete p;
    return nullptr;
  }
  return p;
}

void trib_spm_free(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

int trib_spm_vocab_size(void* handle) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize();
}
int trib_spm_eos_id(void* handle) { return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->eos_id(); }

// *ids is malloc'ed; free with free().
int trib_spm_encode(void* handle, const char* text, size_t len, int** ids, size_t* num_ids, char* err, size_t err_len) {
  std::vector<int> out;
  auto status = static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Encode(std::string_view(text, len), &out);
  if (!status.ok()) {
    set_error(err, err_len, status.ToString());
    return 1;
  }
  *num_ids = out.size();
  *ids = static_cast<int*>(std::malloc(std::max<size_t>(1, out.size()) * sizeof(int)));
  std::memcpy(*ids, out.data(), out.size() * sizeof(int));
  return 0;
}

// *text is malloc'ed; free with free().
int trib_spm_decode(void* handle, const int* ids, size_t num_ids, char** text, size_t* len, char* err, size_t err_len) {
  std::string out;
  auto status =
      static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Decode(std::vector<int>(ids, ids + num_ids), &out);
  if (!status.ok()) {
    set_error(err, err_len, status.ToString());
    return 1;
  }
  *len = out.size();
  *text = static_cast<char*>(std::malloc(out.size() + 1));
  std::memcpy(*text, out.data(), out.size() + 1);
  return 0;
}

void trib_spm_free_buffer(void* buffer) { std::free(buffer); }

// SentencePiece 0.1.97 logs its whole command line before it reads --minloglevel, so its stderr goes to a temporary
// file while it trains, and into the error when training fails.
int trib_spm_train(const char* args, char* err, size_t err_len) {
  char log_path[] = "/tmp/tributary-spm-XXXXXX";
  const int log_fd = mkstemp(log_path);
  const int saved = log_fd >= 0 ? dup(2) : -1;
  if (saved >= 0) dup2(log_fd, 2);
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  std::string log;
  if (saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
  if (log_fd >= 0) {
    char buf[4096];
    lseek(log_fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(log_fd, buf, sizeof(buf))) > 0;) log.append(buf, static_cast<size_t>(n));
    close(log_fd);
    unlink(log_path);
  }
  if (!status.ok()) {
    const size_t keep = 600;
    set_error(err, err_len,
              status.ToString() +
                  (log.empty() ? "" : "; its log ends: " + log.substr(log.size() - std::min(keep, log.size()))));
    return 1;
  }
  return 0;
}

}  // extern "C"
