#include "tributary/comm/signed_messages.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tributary/core/log.h"

namespace tributary::comm {
namespace {

constexpr const char* kMark = "\n#by ";

std::string place(const std::string& key, int author) { return key + "#by " + std::to_string(author); }

}  // namespace

MessageSigner::MessageSigner(std::shared_ptr<const Identity> mine, int self, std::function<std::string(int)> key_of)
    : mine_(std::move(mine)), self_(self), published_(std::move(key_of)) {}

std::string MessageSigner::sign(const std::string& key, const std::string& value) const {
  return value + kMark + std::to_string(self_) + " " + mine_->sign_text(place(key, self_), value);
}

std::string MessageSigner::key_of(int id, bool fresh) {
  if (!fresh)
    if (const auto pin = pinned_.find(id); pin != pinned_.end()) return pin->second;
  std::string key = published_(id);
  if (!fresh) pinned_[id] = key;
  return key;
}

void MessageSigner::forget(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  pinned_.erase(id);
}

std::optional<MessageSigner::Opened> MessageSigner::open(const std::string& key, const std::string& text,
                                                         const std::vector<int>& authors, bool fresh) {
  std::lock_guard<std::mutex> lock(mutex_);
  Opened out;
  std::string why;
  const auto mark = text.rfind(kMark);
  if (mark == std::string::npos) {
    why = "it is not signed";
  } else {
    const std::string tail = text.substr(mark + std::string(kMark).size());
    const auto space = tail.find(' ');
    try {
      out.author = std::stoi(tail.substr(0, space));
    } catch (const std::exception&) {
      out.author = -1;
    }
    out.value = text.substr(0, mark);
    if (out.author < 0 || space == std::string::npos) {
      why = "its signature is malformed";
    } else if (!authors.empty() && std::find(authors.begin(), authors.end(), out.author) == authors.end()) {
      why = fmt::format("its author may not write it (only {})", fmt::join(authors, ", "));
    } else if (const std::string pub = key_of(out.author, fresh); pub.empty()) {
      why = "its author published no identity the run admits";
    } else if (!Identity::verify_text(pub, place(key, out.author), out.value, tail.substr(space + 1))) {
      why = fmt::format("the signature is not that of the identity it published ({})", pub.substr(0, 16));
    }
  }
  if (why.empty()) return out;
  if (refused_.insert(key).second) {
    // Who it claims to be: the signature's author, or — for a key named after its writer — the id the key ends in.
    const std::string claimed = out.author >= 0 ? std::to_string(out.author)
                                                : (authors.size() == 1 ? std::to_string(authors[0]) : "unknown");
    log::warn(
        "participant {}: refused the value at '{}', claimed by participant {}: {} (a participant holding the run's "
        "secret wrote it in another's name); it counts as not written",
        self_, key, claimed, why);
  }
  return std::nullopt;
}

}  // namespace tributary::comm
