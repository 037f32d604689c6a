#include "tributary/optim/module_owners.h"

#include <cmath>

#include "tributary/core/error.h"

namespace tributary {
namespace {

int64_t numel_of(const NamedTensors& tensors) {
  int64_t n = 0;
  for (const auto& [name, t] : tensors) n += t.numel();
  return n;
}

// What one sender ships to one owner: the modules it touched that the owner holds, in module order.
struct Message {
  std::vector<size_t> modules;
  int64_t numel = 0;
  torch::Tensor wire;  // encoded sums, concatenated
  torch::Tensor meta;  // fp64 [weight, paths] per module
};

}  // namespace

OwnerReduceBytes reduce_to_owners(const OwnerReduce& r, comm::Group& group) {
  const size_t M = r.module_ids.size();
  const int n = group.size(), me = group.rank();
  OwnerReduceBytes bytes;
  // Who touched what: one byte per module from every worker.
  auto mask = torch::zeros({static_cast<int64_t>(M)}, torch::kUInt8);
  for (size_t i = 0; i < M; ++i) {
    auto it = r.accumulated.find(r.module_ids[i]);
    if (it != r.accumulated.end() && it->second.paths > 0) mask[int64_t(i)] = 1;
  }
  bytes.control = double(M);
  const std::vector<torch::Tensor> touched = n == 1 ? std::vector<torch::Tensor>{mask} : group.all_gather(mask);
  auto touched_by = [&](int w, size_t i) { return touched[size_t(w)][int64_t(i)].item<uint8_t>() != 0; };

  // Messages: sends[o] from this worker to owner o; recvs[w] from worker w to this owner.
  std::vector<Message> sends(static_cast<size_t>(n)), recvs(static_cast<size_t>(n));
  for (size_t i = 0; i < M; ++i) {
    const int o = r.owner[i];
    if (o != me && touched_by(me, i)) sends[size_t(o)].modules.push_back(i);
    if (o == me)
      for (int w = 0; w < n; ++w)
        if (w != me && touched_by(w, i)) recvs[size_t(w)].modules.push_back(i);
  }
  std::vector<comm::PendingCollective> pending;
  for (int o = 0; o < n; ++o) {
    Message& m = sends[size_t(o)];
    if (m.modules.empty()) continue;
    std::vector<torch::Tensor> parts;
    m.meta = torch::empty({int64_t(m.modules.size()), 2}, torch::kFloat64);
    for (size_t k = 0; k < m.modules.size(); ++k) {
      const auto& acc = r.accumulated.at(r.module_ids[m.modules[k]]);
      for (const auto& s : acc.sum) parts.push_back(s.reshape({-1}));
      m.meta[int64_t(k)][0] = acc.weight;
      m.meta[int64_t(k)][1] = double(acc.paths);
    }
    auto flat = torch::cat(parts).contiguous();
    m.numel = flat.numel();
    m.wire = torch::empty({static_cast<int64_t>(r.codec.encoded_bytes(m.numel))}, torch::kUInt8);
    r.codec.encode(flat, m.wire.data_ptr<uint8_t>());
    const std::string what = fmt::format("DiPaCo pseudo-gradients of {} module(s) to their owner", m.modules.size());
    pending.push_back(group.send(m.wire, o, 2 * me, what));
    pending.push_back(group.send(m.meta, o, 2 * me + 1, what + " (weights)"));
    bytes.sent += double(m.wire.numel()) + double(m.meta.numel() * 8);
  }
  for (int w = 0; w < n; ++w) {
    Message& m = recvs[size_t(w)];
    if (m.modules.empty()) continue;
    for (size_t i : m.modules) m.numel += numel_of(r.owned.at(r.module_ids[i])->global());
    m.wire = torch::empty({static_cast<int64_t>(r.codec.encoded_bytes(m.numel))}, torch::kUInt8);
    m.meta = torch::empty({int64_t(m.modules.size()), 2}, torch::kFloat64);
    const std::string what = fmt::format("DiPaCo pseudo-gradients of {} owned module(s)", m.modules.size());
    pending.push_back(group.recv(m.wire, w, 2 * w, what));
    pending.push_back(group.recv(m.meta, w, 2 * w + 1, what + " (weights)"));
    bytes.recv += double(m.wire.numel()) + double(m.meta.numel() * 8);
  }
  for (auto& p : pending) p.wait();

  // The owner's sums, added in group-rank order (its own contribution at its own rank), then its outer steps.
  std::vector<std::vector<torch::Tensor>> decoded(static_cast<size_t>(n));
  for (int w = 0; w < n; ++w)
    if (!recvs[size_t(w)].modules.empty())
      decoded[size_t(w)] = {r.codec.decode(recvs[size_t(w)].wire.data_ptr<uint8_t>(), recvs[size_t(w)].numel)};
  std::vector<int64_t> offset(static_cast<size_t>(n), 0), row(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < M; ++i) {
    if (r.owner[i] != me) continue;
    OuterOptimizer& opt = *r.owned.at(r.module_ids[i]);
    std::vector<torch::Tensor> sum;
    for (const auto& [name, t] : opt.global()) sum.push_back(torch::zeros_like(t));
    double weight = 0;
    int64_t paths = 0;
    for (int w = 0; w < n; ++w) {
      if (!touched_by(w, i)) continue;
      if (w == me) {
        const auto& acc = r.accumulated.at(r.module_ids[i]);
        for (size_t k = 0; k < sum.size(); ++k) sum[k].add_(acc.sum[k]);
        weight += acc.weight;
        paths += acc.paths;
        continue;
      }
      const torch::Tensor& flat = decoded[size_t(w)][0];
      for (auto& s : sum) {
        s.add_(flat.narrow(0, offset[size_t(w)], s.numel()).view(s.sizes()));
        offset[size_t(w)] += s.numel();
      }
      const auto meta = recvs[size_t(w)].meta[row[size_t(w)]++];
      weight += meta[0].item<double>();
      paths += std::llround(meta[1].item<double>());
    }
    if (paths > 0) opt.apply(finalize(sum, weight, paths, r.norm_rescale));
  }
  return bytes;
}

}  // namespace tributary
