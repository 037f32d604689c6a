// Raw text documents with their source domain, before tokenization. Sources: a directory of text files, a JSONL file
// with a "text" field (the C4 convention), or the built-in multi-domain corpus made from Debian packages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tributary/core/fs.h"

namespace tributary {

struct Document {
  std::string text;
  uint32_t domain;
};

struct Corpus {
  std::vector<std::string> domains;  // domain id -> name
  std::vector<Document> docs;

  uint32_t domain_id(const std::string& name);  // adds the domain if new
  size_t num_bytes() const;
};

// Every regular file under `dir` (sorted, recursive); the domain is the first sub-directory's name ("root" for files
// directly inside). Binary-looking files (NUL bytes) are skipped with a warning.
Corpus read_text_dir(const fs::path& dir);
// One JSON object per line with a string "text"; an optional "domain" (or "source") string tags the document.
Corpus read_jsonl(const fs::path& file);
// Directory or .jsonl/.json file, by what the path is.
Corpus read_corpus(const fs::path& path);

struct DefaultCorpusOptions {
  int64_t max_bytes_per_domain = 3 << 20;
};
// The built-in corpus: King James Bible chapters (`bible`), fortunes, manual pages (roff sources), C headers from
// /usr/include and the Python standard library. Domains differ on purpose (routing experiments rely on it).
// A source that is missing is an Error that says which Debian package to install.
Corpus build_default_corpus(const DefaultCorpusOptions& options);

}  // namespace tributary
