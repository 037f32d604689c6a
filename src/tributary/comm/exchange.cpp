#include "tributary/comm/exchange.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary::comm {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

namespace {

std::string wire_codec(const std::string& name) {
  return name == "topk" || name == "powersgd" || name == "sparseloco" ? "fp32" : name;
}

}  // namespace

Exchange::Exchange(Group& group, const ExchangeOptions& options)
    : group_(group),
      options_(options),
      mode_(options.codec == "topk"                                          ? Mode::top_k
            : options.codec == "sparseloco"                                  ? Mode::sparse
            : options.codec == "powersgd"                                    ? Mode::power_sgd
            : wire_codec(options.codec) == "fp32" || options.codec == "none" ? Mode::all_reduce
                                                                             : Mode::quantized_ring),
      codec_(make_codec(wire_codec(options.codec), options.seed * 7919 + static_cast<uint64_t>(group.rank()))),
      bucket_numel_(std::max<int64_t>(1, static_cast<int64_t>(options.bucket_mb * (1 << 20) / 4))) {
  if (mode_ == Mode::sparse) sparse_.emplace(options.sparse);
  if (options.mac_key) mac_.emplace(*options.mac_key);
  if (options.link) {
    TRIB_CHECK_EQ(options.link->num_ranks, group.size(), "(ranks of the link model vs the group)");
    link_ = options.link;
  }
}

CommStats Exchange::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

CommStats Exchange::take_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  CommStats s = stats_;
  stats_ = CommStats{};
  return s;
}

void Exchange::average(std::vector<torch::Tensor>& tensors, int stream) {
  if (group_.size() == 1) return;
  stream_ = stream;
  if (mode_ == Mode::power_sgd) {
    average_powersgd(tensors);
    return;
  }
  size_t bucket_index = 0;
  // Buckets of consecutive tensors, flattened, so that one collective moves up to bucket_mb.
  size_t i = 0;
  while (i < tensors.size()) {
    size_t j = i;
    int64_t numel = 0;
    while (j < tensors.size() && (j == i || numel + tensors[j].numel() <= bucket_numel_)) numel += tensors[j++].numel();
    if (j == i + 1 && mode_ == Mode::all_reduce && tensors[i].is_contiguous() &&
        tensors[i].scalar_type() == torch::kFloat32 && tensors[i].device().is_cpu()) {
      // One fp32 tensor fills the bucket: reduce it in place, no copies.
      auto flat = tensors[i].detach().view({-1});
      average_bucket(flat, bucket_index++);
      i = j;
      continue;
    }
    std::vector<torch::Tensor> flat_parts;
    for (size_t k = i; k < j; ++k) flat_parts.push_back(tensors[k].detach().reshape({-1}));
    auto flat = torch::cat(flat_parts).to(torch::kFloat32).contiguous();
    average_bucket(flat, bucket_index++);
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (size_t k = i; k < j; ++k) {
      const int64_t n = tensors[k].numel();
      tensors[k].copy_(flat.narrow(0, offset, n).view(tensors[k].sizes()));
      offset += n;
    }
    i = j;
  }
}

void Exchange::account(double sent, double recv, double modelled, Clock::time_point start) {
  const double real = std::chrono::duration<double>(Clock::now() - start).count();
  if (modelled > real) std::this_thread::sleep_for(std::chrono::duration<double>(modelled - real));
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.bytes_sent += sent;
  stats_.bytes_recv += recv;
  stats_.modelled_s += modelled;
  stats_.comm_s += std::chrono::duration<double>(Clock::now() - start).count();
  stats_.exchanges += 1;
}

std::vector<std::pair<std::string, torch::Tensor>> Exchange::codec_state() const {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const char* kind : {"residual", "q"})
    for (const auto& [key, t] : kind[0] == 'r' ? residual_ : q_)
      if (t.defined()) state.emplace_back(fmt::format("{}.{}.{}", kind, key.first, key.second), t);
  return state;
}

void Exchange::load_codec_state(const std::vector<std::pair<std::string, torch::Tensor>>& state,
                                const std::string& origin) {
  residual_.clear();
  q_.clear();
  for (const auto& [name, t] : state) {
    char kind[16] = {};
    int stream = -1;
    unsigned long long index = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "%15[a-z].%d.%llu%n", kind, &stream, &index, &used) != 3 ||
        used != int(name.size()) || stream < 0 || (std::string(kind) != "residual" && std::string(kind) != "q"))
      fail("'{}': '{}' is not an error-feedback tensor (residual.<stream>.<index> or q.<stream>.<index>)", origin,
           name);
    (kind[0] == 'r' ? residual_ : q_)[{stream, size_t(index)}] = t.to(torch::kFloat32).clone();
  }
}

void Exchange::gloo_sum(torch::Tensor& t) {
  const int n = group_.size();
  const auto start = Clock::now();
  std::vector<torch::Tensor> one = {t};
  group_.all_reduce_sum(one);
  const double bytes = double(t.numel()) * 4, wire = 2.0 * (n - 1) / n * bytes;
  account(wire, wire, link_ ? link_->ring_allreduce_s(bytes) : 0.0, start);
}

void Exchange::all_reduce_mean(torch::Tensor& t) {
  gloo_sum(t);
  t.div_(group_.size());
}

void Exchange::sum(torch::Tensor& flat) {
  TRIB_CHECK(codec_->name() == "fp32" && flat.dim() == 1, "(a sealed sum is of one fp32 dimension)");
  if (group_.size() == 1) return;
  mac_ ? ring_sum(flat) : gloo_sum(flat);
}

void Exchange::ring_sum(torch::Tensor& flat) {
  const int n = group_.size();
  std::vector<int64_t> begin(static_cast<size_t>(n) + 1);
  for (int c = 0; c <= n; ++c) begin[c] = flat.numel() * c / n;
  ring(flat, begin, nullptr);
}

void Exchange::average_topk(torch::Tensor& flat, size_t bucket_index) {
  const int n = group_.size();
  const auto start = Clock::now();
  auto& residual = residual_[{stream_, bucket_index}];
  if (!residual.defined()) residual = torch::zeros_like(flat);
  auto x = flat + residual;  // error feedback
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(options_.topk_ratio * double(x.numel())));
  auto idx = std::get<1>(x.abs().topk(k)).to(torch::kInt32);
  auto values = x.index_select(0, idx.to(torch::kInt64));
  // payload: k x (u32 index, f32 value)
  auto payload = torch::cat({idx.view(torch::kUInt8), values.contiguous().view(torch::kUInt8)});
  auto gathered = gather_payloads(payload);
  residual = x.index_fill_(0, idx.to(torch::kInt64), 0.0);  // only once the exchange happened
  flat.zero_();
  for (const auto& p : gathered) {
    auto pi = p.narrow(0, 0, k * 4).view(torch::kInt32).to(torch::kInt64);
    auto pv = p.narrow(0, k * 4, k * 4).view(torch::kFloat32);
    flat.index_add_(0, pi, pv);
  }
  flat.div_(n);
  const double bytes = double(payload.numel() + (mac_ ? WireMac::kBytes : 0));
  account((n - 1) * bytes, (n - 1) * bytes, link_ ? link_->ring_allgather_s(bytes) : 0.0, start);
}

void Exchange::average_sparse(torch::Tensor& flat, size_t bucket_index) {
  const int n = group_.size();
  const auto start = Clock::now();
  auto& residual = residual_[{stream_, bucket_index}];
  if (!residual.defined()) residual = torch::zeros_like(flat);
  auto e = residual * options_.sparse_decay + flat;  // error feedback: what earlier rounds did not send, decayed
  torch::Tensor sent;
  const auto payload = sparse_->encode(e, sent);
  // Sparse payloads do not add up on the way (their indices differ): every rank gathers all and decodes them in rank
  // order, so the sums, and the update every replica applies, are bit-identical.
  const auto gathered = gather_payloads(payload);
  residual = e.sub_(sent);  // only once the exchange happened
  flat.zero_();
  for (const auto& p : gathered) sparse_->decode_add(p, flat);
  flat.div_(n);
  const double bytes = double(payload.numel() + (mac_ ? WireMac::kBytes : 0));
  account((n - 1) * bytes, (n - 1) * bytes, link_ ? link_->ring_allgather_s(bytes) : 0.0, start);
}

void Exchange::average_powersgd(std::vector<torch::Tensor>& tensors) {
  const int64_t r = options_.powersgd_rank;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> uncompressed;
  std::vector<size_t> uncompressed_index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& t = tensors[i];
    const int64_t rows = t.dim() >= 2 ? t.size(0) : 1, cols = t.numel() / std::max<int64_t>(1, rows);
    if (t.dim() < 2 || (rows + cols) * r >= rows * cols) {
      uncompressed.push_back(t.detach().reshape({-1}).to(torch::kFloat32));
      uncompressed_index.push_back(i);
      continue;
    }
    auto m = t.detach().to(torch::kFloat32).reshape({rows, cols});
    auto& residual = residual_[{stream_, i}];
    auto& q_i = q_[{stream_, i}];
    if (!residual.defined()) {
      residual = torch::zeros_like(m);
      // Same initial Q on every rank: a generator seeded by the run seed and the tensor's position.
      auto gen = at::detail::createCPUGenerator(options_.seed * 1000003 + i);
      q_i = at::randn({cols, r}, gen, torch::kFloat32);
    }
    m = m + residual;
    auto p = torch::mm(m, q_i).contiguous();  // (rows, r)
    mean_of_factor(p);
    p = std::get<0>(torch::linalg_qr(p));       // orthonormal columns (rows, r)
    auto q = torch::mm(m.t(), p).contiguous();  // (cols, r)
    mean_of_factor(q);
    auto approx = torch::mm(p, q.t());
    residual = m - approx;
    q_i = q;
    t.copy_(approx.view(t.sizes()));
  }
  if (!uncompressed.empty()) {
    auto flat = torch::cat(uncompressed);
    sum(flat);
    flat.div_(group_.size());
    int64_t offset = 0;
    for (size_t j = 0; j < uncompressed.size(); ++j) {
      auto& t = tensors[uncompressed_index[j]];
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void Exchange::quantized_ring_all_reduce(torch::Tensor& flat) {
  ring_sum(flat);
  flat.div_(group_.size());
}

// PowerSGD's factors are not a linear average of the pseudo-gradients (average_check.h cannot check them): their sum
// is sum()'s, sealed with the run's key (codec_ is fp32 for PowerSGD).
void Exchange::mean_of_factor(torch::Tensor& factor) {
  auto flat = factor.view({-1});
  sum(flat);
  flat.div_(group_.size());
}

void Exchange::reduce_update_gather(torch::Tensor& flat, const std::vector<int64_t>& begin,
                                    const std::function<void(torch::Tensor&)>& update) {
  TRIB_CHECK(mode_ == Mode::all_reduce || mode_ == Mode::quantized_ring, "(top-k and PowerSGD have no owner ring)");
  TRIB_CHECK(static_cast<int>(begin.size()) == group_.size() + 1 && begin.back() == flat.numel(), "chunk offsets");
  if (group_.size() == 1) {
    update(flat);
    return;
  }
  ring(flat, begin, update);
}

void Exchange::ring(torch::Tensor& flat, const std::vector<int64_t>& begin,
                    const std::function<void(torch::Tensor&)>& update) {
  const int n = group_.size(), r = group_.rank();
  const auto start = Clock::now();
  auto chunk = [&](int c) { return flat.narrow(0, begin[c], begin[c + 1] - begin[c]); };
  auto encode = [&](int c) {
    auto values = chunk(c).contiguous();
    auto wire = torch::empty({static_cast<int64_t>(codec_->encoded_bytes(values.numel()))}, torch::kUInt8);
    codec_->encode(values, wire.data_ptr<uint8_t>());
    return wire;
  };
  auto wire_size = [&](int c) { return static_cast<int64_t>(codec_->encoded_bytes(begin[c + 1] - begin[c])); };
  double sent = 0, largest = 0;
  // Reduce-scatter: after step s, rank r holds the partial sum over s + 2 ranks of chunk (r - s - 1) mod n.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = ((r - s) % n + n) % n, recv_c = ((r - s - 1) % n + n) % n;
    const auto in = hop(encode(send_c), wire_size(recv_c), sent, largest);
    chunk(recv_c).add_(codec_->decode(in.data_ptr<uint8_t>(), begin[recv_c + 1] - begin[recv_c]));
  }
  // Rank r now holds the full sum of chunk (r + 1) mod n: the owner's update goes here (DiPaCo's outer step).
  const int owned = (r + 1) % n;
  if (update) {
    auto mine = chunk(owned);
    update(mine);
  }
  // All-gather: the owner of each reduced chunk encodes it once; those bytes travel round the ring unchanged.
  auto carried = encode(owned);
  chunk(owned).copy_(codec_->decode(carried.data_ptr<uint8_t>(), begin[owned + 1] - begin[owned]));
  for (int s = 0; s < n - 1; ++s) {
    const int recv_c = ((r - s) % n + n) % n;
    carried = hop(carried, wire_size(recv_c), sent, largest);
    chunk(recv_c).copy_(codec_->decode(carried.data_ptr<uint8_t>(), begin[recv_c + 1] - begin[recv_c]));
  }
  // Link model: 2 (n - 1) ring steps, each as long as the largest chunk on the slowest edge.
  const double modelled = link_ ? link_->ring_allreduce_s(largest * n) : 0.0;
  account(sent, sent, modelled, start);
}

std::string Exchange::place(int tag, int from, int to) const {
  return fmt::format("{}|{}|{}>{}", group_.prefix(), tag, from, to);
}

torch::Tensor Exchange::hop(const torch::Tensor& out, int64_t in_bytes, double& sent, double& largest) {
  const int n = group_.size(), r = group_.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int tag = tag_++;
  torch::Tensor wire = mac_ ? mac_->seal(out, place(tag, r, next)) : out;
  if (wire_tamper_) wire_tamper_(wire);
  auto in = torch::empty({in_bytes + (mac_ ? WireMac::kBytes : 0)}, torch::kUInt8);
  group_.send_recv(wire, next, in, prev, tag);
  sent += double(wire.numel());
  largest = std::max(largest, double(wire.numel()));
  if (!mac_) return in;
  return mac_->open(in, place(tag, prev, r), fmt::format("ring message {} from rank {} to rank {}", tag, prev, r));
}

std::vector<torch::Tensor> Exchange::gather(const torch::Tensor& flat) {
  TRIB_CHECK(mode_ == Mode::all_reduce || mode_ == Mode::quantized_ring,
             "(a gathered exchange needs a stateless codec; the config refuses the others)");
  const int n = group_.size();
  const int64_t numel = flat.numel();
  if (n == 1) return {flat.to(torch::kFloat32).contiguous()};
  const int64_t encoded = int64_t(codec_->encoded_bytes(numel));
  auto body = torch::empty({encoded}, torch::kUInt8);
  codec_->encode(flat.to(torch::kFloat32).contiguous(), body.data_ptr<uint8_t>());
  auto gathered = gather_signed(body, "update");
  for (auto& g : gathered)
    if (g.defined()) g = codec_->decode(g.data_ptr<uint8_t>(), numel);
  return gathered;
}

std::vector<torch::Tensor> Exchange::gather_values(const torch::Tensor& values) {
  const auto mine = values.to(torch::kFloat64).contiguous();
  if (group_.size() == 1) return {mine};
  auto body = torch::empty({mine.numel() * int64_t(sizeof(double))}, torch::kUInt8);
  std::memcpy(body.data_ptr<uint8_t>(), mine.data_ptr<double>(), size_t(body.numel()));
  auto gathered = gather_signed(body, "message");
  for (auto& g : gathered)
    if (g.defined()) {
      auto out = torch::empty({mine.numel()}, torch::kFloat64);
      std::memcpy(out.data_ptr<double>(), g.data_ptr<uint8_t>(), size_t(body.numel()));
      g = out;
    }
  return gathered;
}

std::vector<torch::Tensor> Exchange::gather_signed(const torch::Tensor& body, const char* what) {
  const int n = group_.size();
  const auto start = Clock::now();
  const int64_t encoded = body.numel();
  const int64_t signed_bytes = options_.identity ? int64_t(Identity::kSignatureBytes) : 0;
  auto payload = torch::empty({encoded + signed_bytes}, torch::kUInt8);
  std::memcpy(payload.data_ptr<uint8_t>(), body.data_ptr<uint8_t>(), size_t(encoded));
  const int tag = tag_;  // gather_payloads' message number: the signature is bound to it and to the sender
  if (options_.identity) {
    const auto signature =
        options_.identity->sign(place(tag, group_.rank(), -1), payload.data_ptr<uint8_t>(), size_t(encoded));
    std::copy(signature.begin(), signature.end(), payload.data_ptr<uint8_t>() + encoded);
  }
  auto gathered = gather_payloads(payload);
  std::vector<torch::Tensor> bodies;
  for (int r = 0; r < n; ++r) {
    const auto p = gathered[size_t(r)].contiguous();
    TRIB_CHECK(p.numel() == payload.numel(), "(an all-gathered payload has the gather's length)");
    const uint8_t* bytes = p.data_ptr<uint8_t>();
    if (options_.identity && r != group_.rank()) {
      const std::string key = options_.public_key_of(r);
      if (!Identity::verify(key, place(tag, r, -1), bytes, size_t(encoded), bytes + encoded)) {
        log::warn(
            "the {} from rank {} of {} is not signed by that participant's identity ({}): it is left out (a "
            "holder of the run's secret speaking as another, or a message replayed from another exchange)",
            what, r, group_.prefix(), key.empty() ? "it published none" : "public key " + key.substr(0, 16) + "...");
        bodies.emplace_back();
        continue;
      }
    }
    bodies.push_back(p.narrow(0, 0, encoded));
  }
  const double bytes = double(payload.numel() + (mac_ ? WireMac::kBytes : 0));
  account((n - 1) * bytes, (n - 1) * bytes, link_ ? link_->ring_allgather_s(bytes) : 0.0, start);
  return bodies;
}

std::vector<torch::Tensor> Exchange::gather_payloads(const torch::Tensor& payload) {
  const int tag = tag_++;
  torch::Tensor wire = mac_ ? mac_->seal(payload, place(tag, group_.rank(), -1)) : payload;
  if (wire_tamper_) wire_tamper_(wire);
  auto gathered = group_.all_gather(wire);
  if (mac_)
    for (size_t i = 0; i < gathered.size(); ++i)
      gathered[i] = mac_->open(gathered[i], place(tag, static_cast<int>(i), -1),
                               fmt::format("payload {} all-gathered from rank {}", tag, i));
  return gathered;
}

void Exchange::average_bucket(torch::Tensor& flat, size_t bucket_index) {
  switch (mode_) {
    case Mode::all_reduce:
      all_reduce_mean(flat);
      break;
    case Mode::quantized_ring:
      quantized_ring_all_reduce(flat);
      break;
    case Mode::top_k:
      average_topk(flat, bucket_index);
      break;
    case Mode::sparse:
      average_sparse(flat, bucket_index);
      break;
    case Mode::power_sgd:
      TRIB_CHECK(false, "(PowerSGD works per tensor, not per bucket)");
  }
}

}  // namespace tributary::comm
