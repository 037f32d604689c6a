// Membership messages (comm/membership.h) signed by the participant that wrote them (comm/identity.h).
//
// The run's secret seals every store value (comm/sealed_store.h), so any holder of it can write a vote, a registration
// or a proposal in another member's name. Signed, such a value is refused — a warning names the key and the member it
// claims to be from — and the protocol goes on as if it had not been written. A signed value is the value, then
// "\n#by <id> <128 hex digits>"; the signature covers the store key, the author and the value, so it cannot be
// moved to another key (another round, epoch or member) or claimed by another author.
//
// The public keys are the ones the participants published at the rendezvous (runtime/rendezvous.h). Every key a
// participant was seen to publish is kept: a message is checked with those first, and with the one published now
// only when none fits — a restarted participant may come with a new identity (a single machine's launch keeps its
// workers' identities, comm/identity.h; other launchers may not), and its predecessor's messages still verify. A new
// key is logged, naming the participant, so a key republished in another's seat is seen.
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
#include "tributary/comm/store.h"

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
  std::optional<Opened> open(const std::string& key, const std::string& text, const std::vector<int>& authors);

 private:
  // Whether one of the keys participant `id` published signed `value` at `place`; "" in `why` when so.
  bool verified(int id, const std::string& place, const std::string& value, const std::string& signature,
                std::string& why);

  std::shared_ptr<const Identity> mine_;
  int self_;
  std::function<std::string(int)> published_;
  std::mutex mutex_;                              // the rounds' thread and the membership's watcher both open messages
  std::map<int, std::vector<std::string>> seen_;  // every key each participant was seen to publish
  std::set<std::string> refused_;                 // keys already warned about
};

// The value at `key` as `signer` writes it (null: as it is), and what a reader takes of the value there: none when it
// is absent, or when `signer` (null: anything goes) refuses it — one of `authors` (empty: any participant) must have
// signed it.
std::string signed_text(const MessageSigner* signer, const std::string& key, const std::string& value);
std::optional<std::string> read_signed(Store& store, MessageSigner* signer, const std::string& key,
                                       const std::vector<int>& authors);

// An agreement on a store key by first writer wins (Store::set_once), among signed values: the first value at `key`
// that one of `authors` (empty: any participant) signed and that `accept` (when given) accepts with its author. A value
// written otherwise moves the agreement to the key's next slot ("<key>/1", ...), which every reader skips alike; a
// forger that keeps writing first ends it after 16 slots, with an Error naming the key. Without a signer (null) every
// value counts as signed, by author -1 (`accept` still skips a malformed one). None while the first slot not skipped
// is empty (`open_slot`: its key).
using Accept = std::function<bool(const std::string& value, int author)>;
std::optional<MessageSigner::Opened> agreed_value(Store& store, MessageSigner* signer, const std::string& key,
                                                  const std::vector<int>& authors, const Accept& accept = nullptr,
                                                  std::string* open_slot = nullptr);
// Proposes `value` (signed by `signer`) at `key`'s first open slot: what was agreed, this value or another's.
MessageSigner::Opened propose_value(Store& store, MessageSigner* signer, const std::string& key,
                                    const std::string& value, const std::vector<int>& authors,
                                    const Accept& accept = nullptr);

}  // namespace tributary::comm
