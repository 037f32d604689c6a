#include "tributary/comm/signed_messages.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tributary/core/error.h"
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

bool MessageSigner::verified(int id, const std::string& place, const std::string& value, const std::string& signature,
                             std::string& why) {
  auto& seen = seen_[id];
  for (const auto& pub : seen)
    if (Identity::verify_text(pub, place, value, signature)) return true;
  const std::string now = published_(id);
  if (now.empty()) {
    why = "its author published no identity the run admits";
    return false;
  }
  if (std::find(seen.begin(), seen.end(), now) == seen.end()) {
    if (!seen.empty())
      log::info("participant {}: participant {} published a new identity {} (a restarted participant)", self_, id,
                now.substr(0, 16));
    seen.push_back(now);
    if (Identity::verify_text(now, place, value, signature)) return true;
  }
  why = fmt::format("the signature is not that of the identity it published ({})", now.substr(0, 16));
  return false;
}

std::optional<MessageSigner::Opened> MessageSigner::open(const std::string& key, const std::string& text,
                                                         const std::vector<int>& authors) {
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
    } else {
      verified(out.author, place(key, out.author), out.value, tail.substr(space + 1), why);
    }
  }
  if (why.empty()) return out;
  if (refused_.insert(key).second) {
    // Who it claims to be: the signature's author, or — for a key named after its writer — the id the key ends in.
    const std::string claimed =
        out.author >= 0 ? std::to_string(out.author) : (authors.size() == 1 ? std::to_string(authors[0]) : "unknown");
    log::warn(
        "participant {}: refused the value at '{}', claimed by participant {}: {} (a participant holding the run's "
        "secret wrote it in another's name); it counts as not written",
        self_, key, claimed, why);
  }
  return std::nullopt;
}

std::string signed_text(const MessageSigner* signer, const std::string& key, const std::string& value) {
  return signer ? signer->sign(key, value) : value;
}

std::optional<std::string> read_signed(Store& store, MessageSigner* signer, const std::string& key,
                                       const std::vector<int>& authors) {
  if (!store.check({key})) return std::nullopt;
  std::string text = store.get(key);
  if (!signer) return text;
  auto opened = signer->open(key, text, authors);
  if (!opened) return std::nullopt;
  return std::move(opened->value);
}

std::optional<MessageSigner::Opened> agreed_value(Store& store, MessageSigner* signer, const std::string& key,
                                                  const std::vector<int>& authors, const Accept& accept,
                                                  std::string* open_slot) {
  constexpr int kSlots = 16;
  for (int slot = 0; slot < kSlots; ++slot) {
    const std::string at = slot == 0 ? key : fmt::format("{}/{}", key, slot);
    if (!store.check({at})) {
      if (open_slot) *open_slot = at;
      return std::nullopt;
    }
    std::string text = store.get(at);
    auto opened = signer ? signer->open(at, text, authors) : MessageSigner::Opened{std::move(text), -1};
    if (opened && (!accept || accept(opened->value, opened->author))) return opened;
  }
  fail(
      "{} values at '{}' in a row were malformed or written in others' names: a participant holding the run's secret "
      "keeps forging them; this participant stops",
      kSlots, key);
}

MessageSigner::Opened propose_value(Store& store, MessageSigner* signer, const std::string& key,
                                    const std::string& value, const std::vector<int>& authors, const Accept& accept) {
  for (;;) {  // ours, unless another's value lands first in the open slot
    std::string slot;
    if (auto agreement = agreed_value(store, signer, key, authors, accept, &slot)) return std::move(*agreement);
    store.set_once(slot, signed_text(signer, slot, value));
  }
}

}  // namespace tributary::comm
