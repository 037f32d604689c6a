#include "tributary/sched/workload.h"

#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/core/fs.h"

namespace tributary::sched {

double Workload::parameters() const {
  return num_parameters > 0 ? num_parameters : 12.0 * double(num_layers) * double(width) * double(width);
}

double Workload::c_dp(int dp, int pp) const {
  if (c_dp_gb > 0 && (d_dp == 0 || (dp == d_dp && pp == d_pp))) return c_dp_gb;
  return parameters() * bytes_per_parameter / pp / 1e9;
}

double Workload::c_pp(int dp, int pp) const {
  if (c_pp_gb > 0 && (d_dp == 0 || (dp == d_dp && pp == d_pp))) return c_pp_gb;
  return double(seq_len) * double(width) * bytes_per_activation * (global_batch / dp) / 1e9;
}

double Workload::tasklet_flops(int dp, int pp) const {
  return 6.0 * parameters() / pp * (global_batch / dp) * double(seq_len);
}

double Workload::stage_memory_gb(int dp, int pp) const {
  double layers_per_stage = num_layers > 0 ? double(num_layers) / pp : 1.0;
  return parameters() / pp * 16.0 / 1e9 + c_pp(dp, pp) * layers_per_stage;
}

Workload parse_workload(const std::string& text, const std::string& origin) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", origin);
  static const char* known[] = {"name",
                                "num_layers",
                                "width",
                                "seq_len",
                                "global_batch",
                                "num_parameters",
                                "bytes_per_parameter",
                                "bytes_per_activation",
                                "d_dp",
                                "d_pp",
                                "c_dp_gb",
                                "c_pp_gb",
                                "sync_every",
                                "micro_batches"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok |= it.key() == k;
    if (!ok) fail("{}: unknown workload field '{}'", origin, it.key());
    if (it.key() == "name") {
      if (!it->is_string()) fail("{}: workload field 'name' must be a string", origin);
      continue;
    }
    if (!it->is_number() || !(it->get<double>() >= 0) || it->get<double>() > 1e18)
      fail("{}: workload field '{}' must be a non-negative number", origin, it.key());
    const bool integral = it.key() == "num_layers" || it.key() == "width" || it.key() == "seq_len" ||
                          it.key() == "d_dp" || it.key() == "d_pp" || it.key() == "sync_every" ||
                          it.key() == "micro_batches";
    if (integral && (!it->is_number_integer() || it->get<double>() > 1 << 24))
      fail("{}: workload field '{}' must be a whole number up to {}", origin, it.key(), 1 << 24);
  }
  Workload w;
  w.name = j.value("name", origin);
  w.num_layers = j.value("num_layers", int64_t{0});
  w.width = j.value("width", int64_t{0});
  w.seq_len = j.value("seq_len", int64_t{0});
  w.global_batch = j.value("global_batch", 0.0);
  w.num_parameters = j.value("num_parameters", 0.0);
  w.bytes_per_parameter = j.value("bytes_per_parameter", 4.0);
  w.bytes_per_activation = j.value("bytes_per_activation", 2.0);
  w.d_dp = j.value("d_dp", 0);
  w.d_pp = j.value("d_pp", 0);
  w.c_dp_gb = j.value("c_dp_gb", 0.0);
  w.c_pp_gb = j.value("c_pp_gb", 0.0);
  w.sync_every = j.value("sync_every", int64_t{1});
  w.micro_batches = j.value("micro_batches", int64_t{1});
  if (w.micro_batches < 1) fail("{}: workload field 'micro_batches' must be at least 1", origin);
  if (w.sync_every < 1)
    fail("{}: workload field 'sync_every' must be at least 1 (1 = data parallel every iteration)", origin);
  const bool derived = w.num_layers > 0 && w.width > 0 && w.seq_len > 0 && w.global_batch > 0;
  if (!derived && (w.c_dp_gb <= 0 || w.c_pp_gb <= 0))
    fail("{}: give either num_layers, width, seq_len and global_batch, or c_dp_gb and c_pp_gb", origin);
  if ((w.d_dp > 0) != (w.d_pp > 0)) fail("{}: give both d_dp and d_pp, or neither", origin);
  return w;
}

Workload load_workload(const std::string& path) {
  if (path == "gpt3-xl") {
    // The paper's workload: GPT3-XL (1.3B), 24 layers, width 2048, sequence 2048, 1M-token batch, 8 x 8 layout,
    // and its exact constants c_DP = 0.65 GB, c_PP = 0.4712 GB.
    Workload w;
    w.name = "gpt3-xl";
    w.num_layers = 24;
    w.width = 2048;
    w.seq_len = 2048;
    w.global_batch = 1048576.0 / 2048.0;
    w.num_parameters = 1.3e9;
    w.d_dp = 8;
    w.d_pp = 8;
    w.c_dp_gb = 0.65;
    w.c_pp_gb = 0.4712;
    return w;
  }
  if (!fs::exists(path)) fail("workload '{}' is neither a file nor the preset gpt3-xl", path);
  return parse_workload(read_file(path), path);
}

}  // namespace tributary::sched
