#include "tributary/comm/exchange.h"

#include <chrono>
#include <regex>
#include <thread>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"
#include "tributary/sched/cluster.h"

namespace tributary::comm {
namespace {

using Clock = std::chrono::steady_clock;

double parse_rate_bits(const std::string& s, const std::string& spec) {
  std::smatch m;
  if (!std::regex_match(s, m, std::regex(R"(\s*([0-9.]+)\s*([KkMmGg]?)(bit|bps|b)?(/s)?\s*)")))
    fail("dist.wan = '{}': cannot read the bandwidth '{}' (e.g. 10Mbit)", spec, s);
  double v = std::stod(m[1]);
  char u = m[2].length() ? static_cast<char>(std::tolower(m[2].str()[0])) : ' ';
  return v * (u == 'k' ? 1e3 : u == 'm' ? 1e6 : u == 'g' ? 1e9 : 1.0);
}

double parse_time_s(const std::string& s, const std::string& spec) {
  std::smatch m;
  if (!std::regex_match(s, m, std::regex(R"(\s*([0-9.]+)\s*(ms|us|s)\s*)")))
    fail("dist.wan = '{}': cannot read the latency '{}' (e.g. 100ms)", spec, s);
  double v = std::stod(m[1]);
  return m[2] == "ms" ? v / 1e3 : m[2] == "us" ? v / 1e6 : v;
}

}  // namespace

LinkModel LinkModel::parse(const std::string& spec, int n) {
  LinkModel l;
  l.num_ranks = n;
  l.latency_s.assign(static_cast<size_t>(n) * n, 0.0);
  l.bytes_per_s.assign(static_cast<size_t>(n) * n, 0.0);
  auto comma = spec.find(',');
  if (comma != std::string::npos && !fs::exists(spec)) {
    double bits = parse_rate_bits(spec.substr(0, comma), spec);
    double lat = parse_time_s(spec.substr(comma + 1), spec);
    if (bits <= 0) fail("dist.wan = '{}': bandwidth must be > 0", spec);
    std::fill(l.latency_s.begin(), l.latency_s.end(), lat);
    std::fill(l.bytes_per_s.begin(), l.bytes_per_s.end(), bits / 8.0);
    return l;
  }
  sched::Cluster c = sched::load_cluster(spec);
  if (c.size() < n) fail("dist.wan = '{}' describes {} devices but the run has {} ranks", spec, c.size(), n);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      l.latency_s[a * n + b] = c.latency_ms(a, b) / 1e3;
      l.bytes_per_s[a * n + b] = c.bandwidth_gbps(a, b) * 1e9 / 8.0;
    }
  return l;
}

double LinkModel::ring_allreduce_s(double bytes) const {
  const int n = num_ranks;
  if (n < 2) return 0;
  double step = 0;
  for (int r = 0; r < n; ++r) {
    int next = (r + 1) % n;
    step = std::max(step, latency_s[r * n + next] + bytes / n / bytes_per_s[r * n + next]);
  }
  return 2.0 * (n - 1) * step;
}

double LinkModel::ring_allgather_s(double bytes_per_rank) const {
  const int n = num_ranks;
  if (n < 2) return 0;
  double step = 0;
  for (int r = 0; r < n; ++r) {
    int next = (r + 1) % n;
    step = std::max(step, latency_s[r * n + next] + bytes_per_rank / bytes_per_s[r * n + next]);
  }
  return (n - 1) * step;
}

std::string LinkModel::describe() const {
  double min_bw = 1e300, max_lat = 0;
  for (int a = 0; a < num_ranks; ++a)
    for (int b = 0; b < num_ranks; ++b)
      if (a != b) {
        min_bw = std::min(min_bw, bytes_per_s[a * num_ranks + b]);
        max_lat = std::max(max_lat, latency_s[a * num_ranks + b]);
      }
  return fmt::format("emulated WAN: slowest link {:.1f} Mbit/s, highest latency {:.0f} ms", min_bw * 8 / 1e6,
                     max_lat * 1e3);
}

Exchange::Exchange(Group& group, const ExchangeOptions& options)
    : group_(group),
      codec_(make_codec(options.codec)),
      lossless_(codec_->name() == "fp32"),
      bucket_numel_(std::max<int64_t>(1, static_cast<int64_t>(options.bucket_mb * (1 << 20) / 4))) {
  if (!options.wan.empty()) link_ = LinkModel::parse(options.wan, group.size());
}

CommStats Exchange::take_stats() {
  CommStats s = stats_;
  stats_ = CommStats{};
  return s;
}

void Exchange::average(std::vector<torch::Tensor>& tensors) {
  if (group_.size() == 1) return;
  // Buckets of consecutive tensors, flattened, so that one collective moves up to bucket_mb.
  size_t i = 0;
  while (i < tensors.size()) {
    size_t j = i;
    int64_t numel = 0;
    while (j < tensors.size() && (j == i || numel + tensors[j].numel() <= bucket_numel_)) numel += tensors[j++].numel();
    std::vector<torch::Tensor> flat_parts;
    for (size_t k = i; k < j; ++k) flat_parts.push_back(tensors[k].detach().reshape({-1}));
    auto flat = torch::cat(flat_parts).to(torch::kFloat32).contiguous();
    average_bucket(flat);
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

void Exchange::average_bucket(torch::Tensor& flat) {
  const int n = group_.size();
  const auto start = Clock::now();
  double modelled = 0;
  if (lossless_) {
    std::vector<torch::Tensor> t = {flat};
    group_.all_reduce_sum(t);
    flat.div_(n);
    const double bytes = double(flat.numel()) * 4;
    stats_.bytes_sent += 2.0 * (n - 1) / n * bytes;
    stats_.bytes_recv += 2.0 * (n - 1) / n * bytes;
    if (link_) modelled = link_->ring_allreduce_s(bytes);
  } else {
    const size_t payload = codec_->encoded_bytes(flat.numel());
    auto wire = torch::empty({static_cast<int64_t>(payload)}, torch::kUInt8);
    codec_->encode(flat, wire.data_ptr<uint8_t>());
    auto gathered = group_.all_gather(wire);
    flat.zero_();
    for (const auto& w : gathered) flat.add_(codec_->decode(w.data_ptr<uint8_t>(), flat.numel()));
    flat.div_(n);
    stats_.bytes_sent += double(n - 1) * payload;
    stats_.bytes_recv += double(n - 1) * payload;
    if (link_) modelled = link_->ring_allgather_s(double(payload));
  }
  const double real = std::chrono::duration<double>(Clock::now() - start).count();
  if (modelled > real) std::this_thread::sleep_for(std::chrono::duration<double>(modelled - real));
  stats_.modelled_s += modelled;
  stats_.comm_s += std::chrono::duration<double>(Clock::now() - start).count();
  stats_.exchanges += 1;
}

}  // namespace tributary::comm
