#include "tributary/data/loader.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "tributary/core/error.h"
#include "tributary/core/rng.h"

namespace tributary {

BatchLoader::BatchLoader(std::shared_ptr<const std::vector<uint32_t>> tokens, LoaderOptions options,
                         std::string split_name)
    : tokens_(std::move(tokens)), options_(options) {
  const int64_t n = static_cast<int64_t>(tokens_->size());
  if (options_.stride <= 0) options_.stride = options_.context;
  const int64_t row = options_.context + 1;
  num_windows_ = n >= row ? (n - row) / options_.stride + 1 : 0;
  windows_per_epoch_ = num_windows_ / options_.world_size;
  if (windows_per_epoch_ < options_.batch_size)
    fail(
        "data split {} has {} tokens: {} windows of context {} per replica, fewer than one batch of {}; use more "
        "data, a smaller model.context or a smaller train.batch_size",
        split_name, n, windows_per_epoch_, options_.context, options_.batch_size);
  start_epoch();
}

void BatchLoader::start_epoch() {
  if (options_.shuffle) {
    order_ = permutation(static_cast<uint64_t>(num_windows_), options_.seed * 1000003ULL + position_.epoch);
  } else {
    order_.resize(static_cast<size_t>(num_windows_));
    std::iota(order_.begin(), order_.end(), 0);
  }
}

void BatchLoader::set_position(LoaderPosition position) {
  if (position.cursor > static_cast<uint64_t>(windows_per_epoch_))
    fail("loader position {} is past the end of the epoch ({} windows): the checkpoint belongs to different data",
         position.cursor, windows_per_epoch_);
  position_ = position;
  start_epoch();
}

LoaderPosition BatchLoader::advanced(LoaderPosition from, int64_t batches) const {
  auto left = static_cast<uint64_t>(std::max<int64_t>(0, batches * options_.batch_size));
  const auto per_epoch = static_cast<uint64_t>(windows_per_epoch_);
  while (left > 0) {
    if (from.cursor >= per_epoch) {
      from.epoch += 1;
      from.cursor = 0;
    }
    const uint64_t take = std::min(left, per_epoch - from.cursor);
    from.cursor += take;
    left -= take;
  }
  return from;
}

void BatchLoader::reshard(int64_t rank, int64_t world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    fail("cannot read data as replica {} of {}: the rank must lie in [0, world size)", rank, world_size);
  const uint64_t taken = position_.cursor * static_cast<uint64_t>(options_.world_size);
  const int64_t per_epoch = num_windows_ / world_size;
  if (per_epoch < options_.batch_size)
    fail(
        "{} windows of context {} are {} per replica for {} replicas, fewer than one batch of {}; use more data or "
        "fewer replicas",
        num_windows_, options_.context, per_epoch, world_size, options_.batch_size);
  options_.rank = rank;
  options_.world_size = world_size;
  windows_per_epoch_ = per_epoch;
  position_.cursor = std::min(taken / static_cast<uint64_t>(world_size), static_cast<uint64_t>(per_epoch));
}

void BatchLoader::next(int64_t* out) {
  const int64_t row = options_.context + 1;
  for (int64_t b = 0; b < options_.batch_size; ++b) {
    if (position_.cursor >= static_cast<uint64_t>(windows_per_epoch_)) {
      position_.epoch += 1;
      position_.cursor = 0;
      start_epoch();
    }
    uint64_t window = order_[position_.cursor * options_.world_size + options_.rank];
    position_.cursor += 1;
    const uint32_t* src = tokens_->data() + window * options_.stride;
    for (int64_t t = 0; t < row; ++t) out[b * row + t] = src[t];
    if (options_.poisoned) {  // the window's own tokens in an order fixed by the seed and the window
      std::mt19937_64 gen(options_.seed * 1000003 + window);
      std::shuffle(out + b * row, out + (b + 1) * row, gen);
    }
  }
}

}  // namespace tributary
