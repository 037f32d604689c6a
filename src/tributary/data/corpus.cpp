#include "tributary/data/corpus.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/hash.h"
#include "tributary/core/log.h"

namespace tributary {

uint32_t Corpus::domain_id(const std::string& name) {
  for (size_t i = 0; i < domains.size(); ++i)
    if (domains[i] == name) return static_cast<uint32_t>(i);
  domains.push_back(name);
  return static_cast<uint32_t>(domains.size() - 1);
}

size_t Corpus::num_bytes() const {
  size_t n = 0;
  for (const auto& d : docs) n += d.text.size();
  return n;
}

namespace {

bool looks_binary(const std::string& text) { return text.find('\0') != std::string::npos; }

std::vector<fs::path> files_under(const fs::path& dir, const std::vector<std::string>& extensions) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_regular_file(ec)) continue;
    const std::string name = it->path().filename().string();
    bool match = extensions.empty();
    for (const auto& e : extensions)
      if (name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) match = true;
    if (match) files.push_back(it->path());
  }
  return files;
}

// Deterministic but spread-out order: sorting by a hash of the path samples the whole tree, not its first folder.
void sort_by_path_hash(std::vector<fs::path>& files) {
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    uint64_t ha = hash64(a.string()), hb = hash64(b.string());
    return ha != hb ? ha < hb : a < b;
  });
}

std::string read_gzip(const fs::path& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return {};
  std::string out;
  char buf[1 << 15];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

std::string run_command(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return {};
  std::string out;
  char buf[1 << 15];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  ::pclose(pipe);
  return out;
}

void require(bool ok, const std::string& what, const std::string& package) {
  if (!ok)
    fail("the built-in corpus needs {} (Debian package '{}'); run `./run setup` or `apt-get install {}`", what, package,
         package);
}

// Adds documents from `files` (read with `reader`) until the domain holds max_bytes.
template <typename Reader>
void add_files(Corpus& corpus, const std::string& domain, std::vector<fs::path> files, int64_t max_bytes,
               Reader reader) {
  uint32_t id = corpus.domain_id(domain);
  sort_by_path_hash(files);
  int64_t total = 0;
  for (const auto& f : files) {
    if (total >= max_bytes) break;
    std::string text = reader(f);
    if (text.size() < 200 || text.size() > (1u << 20) || looks_binary(text)) continue;
    // Long files become several documents (split at line ends), so that the hash-based validation split
    // samples every domain evenly instead of drawing a handful of huge files.
    constexpr size_t kMaxDoc = 16 << 10;
    size_t pos = 0;
    while (pos < text.size() && total < max_bytes) {
      size_t end = std::min(text.size(), pos + kMaxDoc);
      if (end < text.size()) {
        size_t nl = text.rfind('\n', end);
        if (nl != std::string::npos && nl > pos) end = nl + 1;
      }
      total += static_cast<int64_t>(end - pos);
      corpus.docs.push_back({text.substr(pos, end - pos), id});
      pos = end;
    }
  }
}

void add_bible(Corpus& corpus, int64_t max_bytes) {
  require(fs::exists("/usr/bin/bible"), "the `bible` program", "bible-kjv");
  std::string text = run_command("/usr/bin/bible 'Gen1:1-Rev22:21' 2>/dev/null");
  require(text.size() > 1000000, "the King James Bible text", "bible-kjv");
  // Chapters start with a header line such as "Genesis 1" after a blank line; each chapter is a document.
  std::vector<std::string> chapters;
  size_t pos = 0;
  std::string current;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    bool header = !line.empty() && line[0] != ' ' && std::isdigit(static_cast<unsigned char>(line.back())) &&
                  line.find(' ') != std::string::npos && line.size() < 40;
    if (header && !current.empty()) {
      chapters.push_back(std::move(current));
      current.clear();
    }
    if (!line.empty() || !current.empty()) current += line + "\n";
  }
  if (!current.empty()) chapters.push_back(std::move(current));
  // Spread the cap over the whole book: take chapters in hash order.
  std::sort(chapters.begin(), chapters.end(),
            [](const std::string& a, const std::string& b) { return hash64(a) < hash64(b); });
  uint32_t id = corpus.domain_id("bible");
  int64_t total = 0;
  for (auto& c : chapters) {
    if (total >= max_bytes) break;
    total += static_cast<int64_t>(c.size());
    corpus.docs.push_back({std::move(c), id});
  }
}

// Debian's Python standard library: /usr/lib/python3.11 on Debian 12, python3.13 on Debian 13; the newest present.
fs::path debian_python_stdlib() {
  fs::path best = "/usr/lib/python3";
  int best_minor = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3.", 0) != 0 || !e.is_directory()) continue;
    try {
      const int minor = std::stoi(name.substr(8));
      if (minor > best_minor) best_minor = minor, best = e.path();
    } catch (const std::exception&) {
    }
  }
  return best;
}

void add_fortunes(Corpus& corpus, int64_t max_bytes) {
  const fs::path dir = "/usr/share/games/fortunes";
  require(fs::is_directory(dir), "fortune files", "fortunes");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  uint32_t id = corpus.domain_id("fortunes");
  // Fortunes are short; group them ~8 per document so documents are not dominated by end-of-text tokens.
  std::vector<std::string> docs;
  for (const auto& f : files) {
    std::string text = read_file(f);
    std::string doc;
    int count = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find("\n%\n", pos);
      if (end == std::string::npos) end = text.size();
      doc += text.substr(pos, end - pos) + "\n";
      pos = end + 3;
      if (++count == 8) {
        docs.push_back(std::move(doc));
        doc.clear();
        count = 0;
      }
    }
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  std::sort(docs.begin(), docs.end(), [](const std::string& a, const std::string& b) { return hash64(a) < hash64(b); });
  int64_t total = 0;
  for (auto& d : docs) {
    if (total >= max_bytes) break;
    if (looks_binary(d)) continue;
    total += static_cast<int64_t>(d.size());
    corpus.docs.push_back({std::move(d), id});
  }
}

}  // namespace

Corpus read_text_dir(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail("'{}' is not a directory of text files", dir.string());
  std::vector<fs::path> files = files_under(dir, {});
  std::sort(files.begin(), files.end());
  Corpus corpus;
  for (const auto& f : files) {
    std::string text = read_file(f);
    if (looks_binary(text)) {
      log::warn("skipping '{}': contains NUL bytes (binary?)", f.string());
      continue;
    }
    if (text.empty()) continue;
    fs::path rel = fs::relative(f, dir);
    std::string domain = std::distance(rel.begin(), rel.end()) > 1 ? rel.begin()->string() : "root";
    corpus.docs.push_back({std::move(text), corpus.domain_id(domain)});
  }
  if (corpus.docs.empty()) fail("'{}' holds no text files", dir.string());
  return corpus;
}

Corpus read_jsonl(const fs::path& file) {
  std::ifstream in(file);
  if (!in) fail("cannot read '{}'", file.string());
  Corpus corpus;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto obj = nlohmann::json::parse(line, nullptr, false);
    if (obj.is_discarded() || !obj.is_object())
      fail("{}:{}: not a JSON object (expected one {{\"text\": ...}} per line)", file.string(), line_no);
    if (!obj.contains("text") || !obj["text"].is_string())
      fail("{}:{}: missing string field \"text\"", file.string(), line_no);
    std::string domain = "default";
    for (const char* key : {"domain", "source"})
      if (obj.contains(key) && obj[key].is_string()) domain = obj[key].get<std::string>();
    corpus.docs.push_back({obj["text"].get<std::string>(), corpus.domain_id(domain)});
  }
  // getline stops on a read error (or a line too long for memory) the same way as at the end of the file: only
  // badbit tells them apart. Without this check a corpus is silently truncated.
  if (in.bad())
    fail("{}:{}: read error after {} documents ({}); the corpus was not built — check the file and free memory",
         file.string(), line_no + 1, corpus.docs.size(), std::strerror(errno));
  if (corpus.docs.empty()) fail("'{}' holds no documents", file.string());
  return corpus;
}

Corpus read_corpus(const fs::path& path) {
  if (fs::is_directory(path)) return read_text_dir(path);
  if (!fs::exists(path)) fail("input '{}' does not exist", path.string());
  return read_jsonl(path);
}

Corpus build_default_corpus(const DefaultCorpusOptions& options) {
  Corpus corpus;
  const int64_t cap = options.max_bytes_per_domain;
  add_bible(corpus, cap);
  add_fortunes(corpus, cap);

  std::vector<fs::path> man;
  for (const char* section : {"man1", "man2", "man3", "man5", "man7", "man8"}) {
    fs::path d = fs::path("/usr/share/man") / section;
    if (fs::is_directory(d))
      for (auto& f : files_under(d, {".gz"})) man.push_back(f);
  }
  require(man.size() > 100, "manual pages", "manpages-dev");
  add_files(corpus, "manpages", man, cap, [](const fs::path& p) { return read_gzip(p); });

  auto headers = files_under("/usr/include", {".h"});
  require(headers.size() > 100, "C headers under /usr/include", "libc6-dev");
  add_files(corpus, "c_headers", headers, cap, [](const fs::path& p) { return read_file(p); });

  auto py = files_under(debian_python_stdlib(), {".py"});
  require(py.size() > 100, "the Python standard library sources", "libpython3-stdlib");
  add_files(corpus, "python", py, cap, [](const fs::path& p) { return read_file(p); });
  return corpus;
}

}  // namespace tributary
