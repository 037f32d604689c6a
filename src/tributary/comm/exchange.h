// Averaging across replicas with compression, byte accounting and optional WAN emulation, on top of Group.
//
// Stateful compressors (error feedback: what was not sent is added to the next round's input, per tensor/bucket;
// the calls must therefore pass the same tensors in the same order every round):
//   topk      every rank all-gathers the others' k largest-magnitude (index, value) pairs of each bucket;
//   sparseloco SparseLoCo (comm/sparse_chunks.h): error feedback e = decay e + x, then the top-k of every chunk of e
//             as packed indices and 2-bit values; every rank all-gathers the payloads and decodes them identically.
//   powersgd  per matrix M (n x m, tensors with >= 2 dims viewed as first dim x rest): P = M Q, all-reduce P,
//             orthogonalise, Q = M^T P, all-reduce Q, M ~ P Q^T / N (Vogels et al., PyTorch's DDP hook), warm-started
//             Q; compressed only where (n + m) r < n m, the rest goes as fp32 all-reduce.
//
// Byte accounting (per process, what this rank puts on / takes off the wire):
//   fp32 without compression: bucketed ring all-reduce (Gloo), 2 (N-1)/N x bytes sent and received;
//   with a codec: our own quantised ring all-reduce over Gloo send/recv (PRIME's scheme): reduce-scatter in N-1
//   steps, each hop decodes the incoming chunk, adds it in fp32 and re-encodes (error compounds with hops); then the
//   owner of each reduced chunk encodes it once and the all-gather forwards those exact bytes, so every replica
//   decodes identical values. 2 (N-1) encoded chunks of ~n/N values sent and received.
//
// WAN emulation models a ring: at every step each rank sends one chunk to its neighbour, all at once, so a step
// takes the slowest ring edge's latency + chunk / bandwidth; an all-reduce is 2 (N-1) steps of bytes/N, an
// all-gather N-1 steps of one payload. After the real collective finishes, the caller sleeps for whatever the
// model says is left. Modelled: per-pair latency and bandwidth, the ring's step structure. Not modelled: TCP slow
// start and congestion, jitter, packet loss, links shared by several flows, asymmetric links, compute slowed by
// communication threads. The real loopback time is a floor (it is never subtracted below zero).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tributary/comm/codec.h"
#include "tributary/comm/group.h"
#include "tributary/comm/identity.h"
#include "tributary/comm/link_model.h"
#include "tributary/comm/sparse_chunks.h"
#include "tributary/comm/wire_mac.h"

namespace tributary::comm {

struct CommStats {
  double bytes_sent = 0, bytes_recv = 0;
  double comm_s = 0;      // wall time blocked in communication (including emulated link time)
  double modelled_s = 0;  // what the link model said the exchanges take (0 without emulation)
  int64_t exchanges = 0;
};

struct ExchangeOptions {
  std::string codec = "fp32";  // a codec name (codec.h), or "topk" / "powersgd" (stateful, below)
  double bucket_mb = 25;
  std::optional<LinkModel> link;  // emulated links between the group's ranks (none: no emulation)
  double topk_ratio = 0.01;       // top-k: fraction of each bucket's values sent (index u32 + value f32)
  int64_t powersgd_rank = 4;      // PowerSGD: rank r of the low-rank factors
  SparseChunkOptions sparse;      // sparseloco: chunk, k and bits
  double sparse_decay = 0.95;     // sparseloco: error feedback kept from round to round (SparseLoCo's beta)
  uint64_t seed = 0;              // stochastic codecs and PowerSGD's initial Q
  // The run's key: every message of the quantised ring, every top-k / SparseLoCo payload and PowerSGD's factors (on
  // the fp32 ring then) carry its MAC, checked before it is decoded (wire_mac.h; 32 bytes a message, counted). Gloo's
  // fp32 all-reduce cannot carry one (average_check.h checks its result instead).
  std::optional<RunKey> mac_key;
  // Participants' identities (comm/identity.h): gather() signs this rank's payload with `identity` and checks every
  // other's against its sender's public key (`public_key_of(group rank)`); a payload whose signature fails is left
  // out (an undefined tensor), logged naming the rank it claims to come from. Both or neither.
  std::shared_ptr<const Identity> identity;
  std::function<std::string(int)> public_key_of;
};

class Exchange {
 public:
  Exchange(Group& group, const ExchangeOptions& options);

  // Replaces every tensor (fp32, CPU) by its average over the ranks. `stream`: which of the caller's recurring
  // exchanges this is (a Streaming DiLoCo fragment, a data-parallel bucket): stateful codecs keep their error feedback
  // per stream, bucket and tensor.
  void average(std::vector<torch::Tensor>& tensors, int stream = 0);
  // An all-reduce with an owner's step in the middle (DiPaCo's per-module outer step): a ring reduce-scatter of
  // `flat` in the caller's chunks (begin: size + 1 offsets), after which rank r holds the full sum of chunk
  // (r + 1) mod size and replaces it in place with `update`; then a ring all-gather of the updated chunks. Bytes are
  // an all-reduce's; the run's codec applies (fp32 without one), and the owner's encoded bytes travel unchanged,
  // so every rank decodes the same values. Not available with topk/powersgd (refused by the callers' configs).
  void reduce_update_gather(torch::Tensor& flat, const std::vector<int64_t>& begin,
                            const std::function<void(torch::Tensor&)>& update);
  // The sum of `flat` (fp32, one dimension) over the group, accounted, for sums comm/average_check.h cannot check
  // (PowerSGD's factors, a pipeline stage's gradients): Gloo's all-reduce, or with the run's key (mac_key) the fp32
  // ring, every hop sealed — the same sum (two ranks add a + b, bit for bit). Only an exchange whose wire format is
  // fp32 (codec "fp32", "none" or "powersgd").
  void sum(torch::Tensor& flat);
  // Every rank's `flat` (fp32, one dimension, the same length on every rank), encoded by the run's codec, sealed with
  // the run's key when there is one, all-gathered and decoded: [rank] -> fp32 values, this rank's own decoded too, so
  // every rank holds the same tensors (robust aggregation judges each update as received: optim/robust_aggregate.h).
  // (N-1) encoded payloads sent and received. Only a stateless codec (not topk, powersgd or sparseloco). With
  // identities, each payload carries its sender's signature: one that fails comes back undefined.
  std::vector<torch::Tensor> gather(const torch::Tensor& flat);
  // Every rank's `values` (a few numbers, the same count on every rank: a robust round's loss scores) as fp64, not
  // encoded by the codec, sealed and signed as gather()'s payloads: [rank] -> values, undefined where a signature
  // fails.
  std::vector<torch::Tensor> gather_values(const torch::Tensor& values);

  // After the group re-formed with other members (fault tolerance): the ring tags restart (ranks may have left a
  // failed round at different steps) and the emulated links are the new members' (`link`, when emulating).
  void regroup(std::optional<LinkModel> link) {
    tag_ = 0;
    if (link_) link_ = std::move(link);
  }

  CommStats stats() const;
  CommStats take_stats();  // returns and resets; safe to call while another thread runs average()
  const Codec& codec() const { return *codec_; }
  // The stateful codecs' error feedback by (stream, bucket or tensor): what this rank has not sent yet.
  const std::map<std::pair<int, size_t>, torch::Tensor>& error_feedback() const { return residual_; }
  // The same for a checkpoint, named "residual.<stream>.<index>" (and PowerSGD's "q.<stream>.<index>"): this rank's
  // own, so each rank saves and resumes it; empty for the stateless codecs. Call only with no exchange in flight.
  std::vector<std::pair<std::string, torch::Tensor>> codec_state() const;
  // Restores codec_state() (resume): a later average() goes on from it bit for bit. Error naming `origin` for a name
  // that is not one of the above.
  void load_codec_state(const std::vector<std::pair<std::string, torch::Tensor>>& state, const std::string& origin);
  const std::optional<LinkModel>& link_model() const { return link_; }
  const WireMac* mac() const { return mac_ ? &*mac_ : nullptr; }  // the run's (invocation's) key; null without one
  // Tests: changes every message this rank puts on the wire after it was sealed, as a stranger on the path would.
  void set_wire_tamper(std::function<void(torch::Tensor&)> tamper) { wire_tamper_ = std::move(tamper); }

 private:
  void average_bucket(torch::Tensor& flat, size_t bucket_index);
  void quantized_ring_all_reduce(torch::Tensor& flat);
  void ring(torch::Tensor& flat, const std::vector<int64_t>& begin, const std::function<void(torch::Tensor&)>& update);
  void average_topk(torch::Tensor& flat, size_t bucket_index);
  void average_sparse(torch::Tensor& flat, size_t bucket_index);
  void average_powersgd(std::vector<torch::Tensor>& tensors);
  void all_reduce_mean(torch::Tensor& t);      // gloo_sum, then the mean
  void gloo_sum(torch::Tensor& t);             // Gloo's all-reduce with accounting and emulation
  void ring_sum(torch::Tensor& flat);          // the codec's ring in equal chunks, no owner's step
  void mean_of_factor(torch::Tensor& factor);  // PowerSGD's factors: sum(), then the mean
  // One ring hop: `out` to the next rank, `in_bytes` from the previous one, sealed and opened with the MAC; returns
  // the message received.
  torch::Tensor hop(const torch::Tensor& out, int64_t in_bytes, double& sent, double& largest);
  std::vector<torch::Tensor> gather_payloads(const torch::Tensor& payload);  // all-gather, sealed and opened
  // `body` (uint8) signed with this rank's identity (when it has one), all-gathered: every rank's body, undefined
  // where the signature is not its rank's (logged, naming the rank and `what` it was).
  std::vector<torch::Tensor> gather_signed(const torch::Tensor& body, const char* what);
  std::string place(int tag, int from, int to) const;  // a message's place, which its MAC is bound to
  void account(double bytes_sent, double bytes_recv, double modelled_s, std::chrono::steady_clock::time_point start);
  // How a bucket is averaged, decided once from the options.
  enum class Mode { all_reduce, quantized_ring, top_k, sparse, power_sgd };

  Group& group_;
  ExchangeOptions options_;
  Mode mode_;
  // Error feedback, per (stream, bucket) for topk and sparseloco, per (stream, tensor) for PowerSGD (and its Q).
  std::map<std::pair<int, size_t>, torch::Tensor> residual_, q_;
  int stream_ = 0;  // of the average() in progress
  std::optional<SparseChunks> sparse_;
  std::unique_ptr<Codec> codec_;  // the wire format of quantized_ring (fp32 otherwise)
  int64_t bucket_numel_;
  std::optional<LinkModel> link_;
  mutable std::mutex stats_mutex_;
  CommStats stats_;
  int tag_ = 0;  // message numbers: ring step tags (same sequence on every rank)
  std::optional<WireMac> mac_;
  std::function<void(torch::Tensor&)> wire_tamper_;
};

}  // namespace tributary::comm
