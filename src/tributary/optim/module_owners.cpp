#include "tributary/optim/module_owners.h"

#include <cmath>
#include <exception>

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary {
namespace {

int64_t numel_of(const NamedTensors& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.numel();
  return n;
}

}  // namespace

// What one sender ships to one owner: the modules it touched that the owner holds, in module order.
struct OwnerUpload::Message {
  std::vector<size_t> modules;
  int64_t numel = 0;
  torch::Tensor wire;           // encoded sums, concatenated (sealed on the wire: wire_mac.h)
  torch::Tensor meta;           // fp64 [weight, paths] per module
  torch::Tensor meta_wire;      // its bytes as they travel (sealed)
  torch::Tensor values;         // the receiver's decoded sums
  int64_t offset = 0, row = 0;  // the owner's reading position in `values` and `meta` (modules come in module order)
};

// touched[w][i]: worker w's paths went through module i this round (one byte per module from every worker).
std::vector<std::vector<bool>> OwnerUpload::who_touched(const OwnedRound& r) {
  const size_t M = r.contributions.size();
  auto mask = torch::zeros({static_cast<int64_t>(M)}, torch::kUInt8);
  for (size_t i = 0; i < M; ++i)
    if (r.contributions[i] != nullptr && r.contributions[i]->paths > 0) mask[int64_t(i)] = 1;
  std::vector<torch::Tensor> all = group_.size() == 1 ? std::vector<torch::Tensor>{mask}
                                                      : group_.all_gather(sealed(mask, "mask", group_.rank(), -1));
  std::vector<std::vector<bool>> touched;
  for (size_t w = 0; w < all.size(); ++w) {
    auto bytes = group_.size() == 1 ? all[w] : opened(all[w], "mask", int(w), -1).contiguous();
    touched.emplace_back(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + M);
  }
  return touched;
}

torch::Tensor OwnerUpload::sealed(const torch::Tensor& bytes, const std::string& what, int from, int to) const {
  return mac_ ? mac_->seal(bytes, fmt::format("{}|{}|{}>{}", place_, what, from, to)) : bytes;
}

torch::Tensor OwnerUpload::opened(const torch::Tensor& bytes, const std::string& what, int from, int to) const {
  if (!mac_) return bytes;
  return mac_->open(bytes, fmt::format("{}|{}|{}>{}", place_, what, from, to),
                    fmt::format("DiPaCo's {} from worker {} (group rank)", what, from));
}

// Encodes this worker's sums of m.modules (with `feedback`: sparse, error feedback added) and starts sending them to
// owner `o`; returns the bytes.
double OwnerUpload::post_send(const OwnedRound& r, int o, Message& m, std::vector<comm::PendingCollective>& pending) {
  std::vector<const std::vector<torch::Tensor>*> sums;
  m.meta = torch::empty({int64_t(m.modules.size()), 2}, torch::kFloat64);
  for (size_t k = 0; k < m.modules.size(); ++k) {
    const ModuleAccumulator& acc = *r.contributions[m.modules[k]];
    sums.push_back(&acc.sum);
    m.meta[int64_t(k)][0] = acc.weight;
    m.meta[int64_t(k)][1] = double(acc.paths);
  }
  if (feedback_) {
    m.wire = feedback_->encode(m.modules, sums);
  } else {
    std::vector<torch::Tensor> parts;
    for (const auto* sum : sums)
      for (const auto& s : *sum) parts.push_back(s.reshape({-1}));
    auto flat = torch::cat(parts).contiguous();
    m.numel = flat.numel();
    m.wire = torch::empty({static_cast<int64_t>(codec_.encoded_bytes(m.numel))}, torch::kUInt8);
    codec_.encode(flat, m.wire.data_ptr<uint8_t>());
  }
  const std::string what = fmt::format("DiPaCo pseudo-gradients of {} module(s) to their owner", m.modules.size());
  const int me = group_.rank();
  m.wire = sealed(m.wire, "sums", me, o);
  m.meta_wire = sealed(m.meta.view(torch::kUInt8).reshape({-1}), "weights", me, o);
  pending.push_back(group_.send(m.wire, o, 2 * me, what));
  pending.push_back(group_.send(m.meta_wire, o, 2 * me + 1, what + " (weights)"));
  return double(m.wire.numel() + m.meta_wire.numel());
}

// Starts receiving worker w's sums of this owner's modules m.modules; returns the bytes.
double OwnerUpload::post_recv(const OwnedRound& r, int w, Message& m, std::vector<comm::PendingCollective>& pending) {
  for (size_t i : m.modules) m.numel += numel_of(*r.owned[i]);
  const int64_t bytes = feedback_ ? feedback_->chunks().payload_bytes(m.numel) : int64_t(codec_.encoded_bytes(m.numel));
  const int64_t tag = mac_ ? comm::WireMac::kBytes : 0;
  m.wire = torch::empty({bytes + tag}, torch::kUInt8);
  m.meta_wire = torch::empty({int64_t(m.modules.size()) * 2 * 8 + tag}, torch::kUInt8);
  const std::string what = fmt::format("DiPaCo pseudo-gradients of {} owned module(s)", m.modules.size());
  pending.push_back(group_.recv(m.wire, w, 2 * w, what));
  pending.push_back(group_.recv(m.meta_wire, w, 2 * w + 1, what + " (weights)"));
  return double(m.wire.numel() + m.meta_wire.numel());
}

// The owner's step of module i: the sums added in group-rank order (its own at its own rank), then the outer loop's
// step.
void OwnerUpload::step_owned(const OwnedRound& r, size_t i, const std::vector<std::vector<bool>>& touched,
                             std::vector<Message>& recvs) {
  const int me = group_.rank();
  std::vector<torch::Tensor> sum;
  for (const auto& [name, t] : *r.owned[i]) sum.push_back(torch::zeros_like(t));
  double weight = 0;
  int64_t paths = 0;
  for (size_t w = 0; w < touched.size(); ++w) {
    if (!touched[w][i]) continue;
    if (int(w) == me) {
      const ModuleAccumulator& acc = *r.contributions[i];
      for (size_t k = 0; k < sum.size(); ++k) sum[k].add_(acc.sum[k]);
      weight += acc.weight;
      paths += acc.paths;
      continue;
    }
    for (auto& s : sum) {
      s.add_(recvs[w].values.narrow(0, recvs[w].offset, s.numel()).view(s.sizes()));
      recvs[w].offset += s.numel();
    }
    const auto meta = recvs[w].meta[recvs[w].row++];
    weight += meta[0].item<double>();
    paths += std::llround(meta[1].item<double>());
  }
  r.step(i, sum, weight, paths);
}

void OwnerUpload::reduce(const OwnedRound& r) {
  const size_t M = r.contributions.size();
  const size_t n = static_cast<size_t>(group_.size());
  const int me = group_.rank();
  bytes_ = {};
  bytes_.control = double(M) + (mac_ ? double(comm::WireMac::kBytes) : 0.0);
  // sends[o]: from this worker to owner o; recvs[w]: from worker w to this owner.
  std::vector<Message> sends(n), recvs(n);
  std::vector<std::vector<bool>> touched;
  std::exception_ptr failure;  // this worker's exchange failed; with a gate, the verdict says what that means
  std::string why;
  try {
    touched = who_touched(r);
    for (size_t i = 0; i < M; ++i) {
      const int o = r.owner[i];
      if (o != me && touched[size_t(me)][i]) sends[size_t(o)].modules.push_back(i);
      if (o == me)
        for (size_t w = 0; w < n; ++w)
          if (int(w) != me && touched[w][i]) recvs[w].modules.push_back(i);
    }
    std::vector<comm::PendingCollective> pending;
    for (size_t w = 0; w < n; ++w) {
      if (!sends[w].modules.empty()) bytes_.sent += post_send(r, int(w), sends[w], pending);
      if (!recvs[w].modules.empty()) bytes_.recv += post_recv(r, int(w), recvs[w], pending);
    }
    for (auto& p : pending) p.wait();
    for (size_t w = 0; w < n; ++w) {  // nothing is decoded before every message's tag checked
      Message& m = recvs[w];
      if (m.modules.empty()) continue;
      m.wire = opened(m.wire, "sums", int(w), me);
      m.meta = opened(m.meta_wire, "weights", int(w), me).clone().view(torch::kFloat64).view({-1, 2});
    }
  } catch (const NetworkError& e) {
    failure = std::current_exception();
    why = e.what();
  } catch (...) {
    if (feedback_) feedback_->discard();
    throw;
  }
  const bool all_alive = !gate_ || gate_();
  if (failure || !all_alive) {
    if (feedback_) feedback_->discard();             // the round is not applied: what was encoded may not have arrived
    if (all_alive) std::rethrow_exception(failure);  // nobody died, yet this worker's exchange failed
    throw ExchangeAborted(failure ? why : "a worker died during the exchange");
  }
  if (feedback_) feedback_->commit();
  for (auto& m : recvs) {
    if (m.modules.empty()) continue;
    if (feedback_) {
      m.values = torch::zeros({m.numel}, torch::kFloat32);
      feedback_->chunks().decode_add(m.wire, m.values);
    } else {
      m.values = codec_.decode(m.wire.data_ptr<uint8_t>(), m.numel);
    }
  }
  for (size_t i = 0; i < M; ++i)
    if (r.owner[i] == me) step_owned(r, i, touched, recvs);
}

}  // namespace tributary
