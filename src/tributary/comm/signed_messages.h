// Membership messages (comm/membership.h) signed by the participant that wrote them (comm/identity.h).
//
// The run's secret seals every store value (comm/sealed_store.h), so any holder of it can write a vote, a registration
// or a proposal in another member's name. Signed, such a value is refused — a warning names the key and the member it
// claims to be from — and the protocol goes on as if it had not been written. A signed value is the value, then
// "\n#by <id> <128 hex digits>"; the signature covers the store key, the author and the value, so it cannot be
// moved to another key (another round, epoch or member) or claimed by another author.
//
// The public keys are the ones the participants published at the rendezvous (runtime/rendezvous.h). A member's key is
// read once and pinned (a later overwrite of it is not believed) until forget(id): a member admitted anew may be a
// new process with a new identity. What a joiner writes before it is a member is checked with its key as published
// now (`fresh`).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tributary/comm/identity.h"

namespace tributary::comm {

class MessageSigner {
 public:
  // `mine`: this participant's identity, member `self`; `key_of(id)`: the public key member `id` published (empty:
  // none, or one dist.admission does not list).
  MessageSigner(std::shared_ptr<const Identity> mine, int self, std::function<std::string(int)> key_of);

  int self() const { return self_; }
  // `value` as this member writes it at store key `key`.
  std::string sign(const std::string& key, const std::string& value) const;

  struct Opened {
    std::string value;
    int author = -1;
  };
  // `text` (read at `key`) opened: its value and author when its author is one of `authors` (empty: any
  // participant) and signed it for this key; none otherwise (a warning, once per key, names the claimed author).
  std::optional<Opened> open(const std::string& key, const std::string& text, const std::vector<int>& authors,
                             bool fresh = false);
  // Member `id`'s key is read again at its next message (it was admitted anew).
  void forget(int id);

 private:
  std::string key_of(int id, bool fresh);

  std::shared_ptr<const Identity> mine_;
  int self_;
  std::function<std::string(int)> published_;
  std::mutex mutex_;  // the rounds' thread and the membership's watcher both open messages
  std::map<int, std::string> pinned_;
  std::set<std::string> refused_;  // keys already warned about
};

}  // namespace tributary::comm
