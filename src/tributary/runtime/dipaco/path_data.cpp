#include "tributary/runtime/dipaco/path_data.h"

#include "tributary/core/error.h"
#include "tributary/data/dataset.h"

namespace tributary {

PathData load_path_data(const fs::path& routes, int64_t path, const RunConfig& config) {
  const fs::path dir = routes / fmt::format("path-{}", path);
  Dataset ds = Dataset::open(dir);
  const int64_t row = config.model.context + 1;
  auto tokens = ds.load_tokens("train");
  const int64_t units = static_cast<int64_t>(tokens.size()) / row;
  const int64_t held = config.dipaco.holdout_permille > 0
                           ? std::max<int64_t>(1, units * config.dipaco.holdout_permille / 1000)
                           : 0;
  const int64_t b = config.train.batch_size;
  if (units - held < b)
    fail("path {}'s shard '{}' has {} training units of {} tokens ({} held out), fewer than one batch of {}: route "
         "with fewer modules, --overlap 2 or balanced k-means, or lower train.batch_size",
         path, dir.string(), units - held, row, held, b);
  PathData d;
  d.vocab_size = ds.vocab_size();
  std::vector<int64_t> h(tokens.end() - held * row, tokens.end());
  d.holdout = held > 0 ? torch::tensor(h, torch::kInt64).reshape({held, row}) : torch::Tensor();
  tokens.resize(static_cast<size_t>((units - held) * row));
  d.weight = double(tokens.size());
  d.train = std::make_shared<const std::vector<uint32_t>>(std::move(tokens));
  return d;
}

}  // namespace tributary
