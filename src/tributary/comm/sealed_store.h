// The run's secret on the store: every value is sealed (AES-256-GCM, the key name as associated data) before it
// leaves this process, and opened when it comes back. Whoever reaches the store's port without the secret reads only
// ciphertext (not the configuration, not a path's state) and cannot write a value that a worker accepts — a forged
// death report, join request, vote or Gloo address fails to open and is refused, naming the key. Counters (`add`) are
// sealed too: an add is a compare-and-set loop on the sealed value. Our store server (comm/store_server.h) also serves
// only connections that proved the key (prove_run_key, below), so a stranger cannot delete or overwrite values either
// — see docs/distributed.md, "Threat model".
//
// The secret: TRIBUTARY_RUN_SECRET (64 hex digits of the derived key: what `launch` gives its workers, never on a
// command line) or TRIBUTARY_SECRET_FILE (a file every machine of the run holds; the key is SHA-256 of its bytes
// with this format's label). Neither: values go as they are (a warning at launch says what that leaves open).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace tributary::comm {

using RunKey = std::array<uint8_t, 32>;

// The key this process's environment gives (TRIBUTARY_RUN_SECRET, else TRIBUTARY_SECRET_FILE); none without either.
// An Error naming the variable or file when it is malformed, unreadable or too short (fewer than 16 bytes).
std::optional<RunKey> run_key_from_environment();
// The key of a secret file's bytes (`origin` names it in errors).
RunKey run_key_of_secret(const std::string& secret, const std::string& origin);
// The key of a secret file (`origin` names it in errors): a regular file of at most 4 KiB.
RunKey run_key_of_file(const std::string& path, const std::string& origin);
// A fresh random key (one machine's run: launch makes one and hands it to its workers).
RunKey random_run_key();
// The form TRIBUTARY_RUN_SECRET carries: 64 hex digits.
std::string run_key_hex(const RunKey& key);

// Seals `value` for `key`: "TSv1" + 12-byte nonce + ciphertext + 16-byte tag.
std::vector<uint8_t> seal(const RunKey& run_key, const std::string& key, const std::vector<uint8_t>& value);
// The value sealed for `key`, or none when it was not sealed with this run's key (a stranger's, or another run's).
std::optional<std::vector<uint8_t>> open_sealed(const RunKey& run_key, const std::string& key,
                                                const std::vector<uint8_t>& sealed);

// `inner` with every value sealed for `key` (PrefixStore-like: the wrapper is what Gloo and our Store see). A get of a
// value not sealed with the run's key throws, naming the key; an add of a counter holding one does too. A clone (a new
// connection) proves the key to the server as prove_run_key does.
c10::intrusive_ptr<c10d::Store> sealed_store(c10::intrusive_ptr<c10d::Store> inner, const RunKey& key);

// Entry to the run's store (comm/store_server.h): a server that has the run's key serves a connection only once it has
// proved the key, by answering the server's nonce (a per-connection value under kStoreChallengeKey) with the HMAC of
// it (SHA-256, keyed with the run's key) under kStoreProofKey. Until then the connection may only ping, fetch the nonce
// and answer it; anything else closes it. A server without a key serves everyone, and still hands out nonces.
inline constexpr const char* kStoreChallengeKey = "/tributary/auth/challenge";
inline constexpr const char* kStoreProofKey = "/tributary/auth/proof";
std::string store_nonce();  // 32 random bytes
std::string store_proof(const RunKey& key, const std::string& nonce);
bool store_proof_holds(const RunKey& key, const std::string& nonce, const std::string& proof);  // constant time
// Proves `key` on a fresh raw client of the run's store, before anything else is asked of it. False (and nothing
// sent) when the server hands out no nonce: a server that is not Tributary's (torchrun's agent), which serves everyone.
bool prove_run_key(c10d::Store& raw, const RunKey& key);

}  // namespace tributary::comm
