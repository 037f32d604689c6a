// The rendezvous of a multi-process run: connect to the run's store (rank 0 hosts it unless an agent does), agree on
// the world size (a rank started with another WORLD_SIZE is refused at once, naming both sizes, instead of every
// rank waiting for ranks that will never come; a second process with a taken rank is refused), then refuse ranks whose
// resolved configs differ, naming the ranks and keys. While waiting it says which ranks are missing; a rank that
// refuses posts why, and every waiting rank stops with that reason.
#pragma once

#include <map>
#include <memory>

#include "tributary/comm/group.h"
#include "tributary/comm/identity.h"
#include "tributary/comm/store.h"
#include "tributary/config/run_config.h"
#include "tributary/launch/dist_env.h"

namespace tributary {

// `identity`: where this participant's published identity goes (publish_identity, below); may be null.
comm::Store rendezvous(const RunConfig& config, const DistEnv& env,
                       std::shared_ptr<const comm::Identity>* identity = nullptr);
// The first step of the rendezvous: this process takes rank `env.rank`'s seat ("seat/<rank>", first writer wins), or
// is refused with an Error naming the rank and the process that holds it — a second process started with a taken
// rank leaves before it touches the run, instead of racing the first for its connections. A joiner (launch
// --max-restarts) takes its dead predecessor's seat: the membership admits it (comm/membership.h).
void claim_seat(comm::Store& store, const DistEnv& env);
// This participant's identity (comm/identity.h) published at "identity/<rank>" (a joiner replaces its predecessor's),
// once its seat is taken: its file's (TRIBUTARY_IDENTITY_FILE, which launch --secret-file F sets to
// F.identity-<rank>), or a fresh one. Null in a run without a secret and without dist.admission (anyone may write
// anything there). Refused, naming the rank and the key, when dist.admission does not list it.
std::shared_ptr<const comm::Identity> publish_identity(comm::Store& store, const RunConfig& config, const DistEnv& env);
// The public key rank `rank` published, as receivers check signatures with: pinned by `pins` at the first read (a
// later overwrite of the key is not believed until the caller clears the pin: a new membership), and empty when
// `admitted` (dist.admission's keys; empty: open) does not list it (logged).
std::string published_key(comm::Store& store, const std::vector<std::string>& admitted, int rank,
                          std::map<int, std::string>& pins);
// A second connection to the run's store (after the rendezvous), for a thread of its own such as a heartbeat.
comm::Store reconnect_store(const RunConfig& config, const DistEnv& env);

// `tributary launch`'s own connection to the run's store at addr:port (launch's workers use no agent prefix), with
// the workers' key prefix: it reports workers' exits through it (comm/exit_reports.h, comm::Membership::report_lost).
// `attempt`: launch's attempt (launcher.h), whose keys it reads and writes. `first`: this launch never reached the
// store (its host may not be up yet): it waits for it up to `timeout`; otherwise a refused connection means the host
// has gone, and the NetworkError comes at once.
// `scope`: a part of the run's keys (kIslandsScope).
comm::Store connect_supervisor(const std::string& addr, int port, std::chrono::milliseconds timeout, int attempt = 0,
                               bool first = true, const std::string& scope = "");

// The keys of the island leads' quorum (dist.fault_tolerant with parallel.islands): its own scope of the run's
// store, so that its members (the islands) and the run's ranks never share a key.
inline constexpr const char* kIslandsScope = "/islands";
// A connection to the run's store under `scope` of its keys (after the rendezvous).
comm::Store connect_scope(const RunConfig& config, const DistEnv& env, const std::string& scope);

// The process groups' options from the config: dist.collective_timeout_s.
comm::GroupOptions group_options(const RunConfig& config);

}  // namespace tributary
