// Yields [B, T+1] windows of token ids from one split's token stream (inputs = [:, :T], targets = [:, 1:]).
// Windows are the chunks stream[i*S, i*S+T+1) (S = stride, T by default); each epoch visits them in a permutation fixed
// by (seed, epoch). The position (epoch, cursor) is part of every checkpoint, so resuming continues the exact order.
// Replicas of a distributed run take every world-th window starting at their rank; reshard() follows a world that
// changes size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tributary {

struct LoaderOptions {
  int64_t batch_size = 16;
  int64_t context = 256;
  uint64_t seed = 0;
  bool shuffle = true;  // false: windows in stream order (validation)
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t stride = 0;     // tokens between window starts; 0: context (consecutive windows share one token).
                          // context + 1: disjoint units, as routed DiPaCo shards store them
  bool poisoned = false;  // tests and benchmarks (optim/adversary.h, poison): every window's tokens shuffled
};

struct LoaderPosition {
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // windows of this replica already yielded in this epoch
};

class BatchLoader {
 public:
  // `split_name` only labels errors (e.g. "data/default val").
  BatchLoader(std::shared_ptr<const std::vector<uint32_t>> tokens, LoaderOptions options, std::string split_name);

  void next(int64_t* out);  // writes batch_size * (context + 1) ids, row-major
  int64_t num_windows() const { return num_windows_; }
  int64_t batch_size() const { return options_.batch_size; }
  int64_t context() const { return options_.context; }
  LoaderPosition position() const { return position_; }
  void set_position(LoaderPosition position);
  // Where next() would be after `batches` more batches from `from`, under the current world (epochs wrap as in next()).
  LoaderPosition advanced(LoaderPosition from, int64_t batches) const;
  int64_t rank() const { return options_.rank; }
  int64_t world_size() const { return options_.world_size; }
  // The world changed (a replica died or joined, or a run resumed with another number of workers): read as `rank`
  // of `world_size` from here on. Replicas move in lockstep, so cursor x world windows of this epoch's order are
  // taken; the new cursor is that count / world_size, rounded down: fewer than world_size windows are read twice,
  // none is skipped. Every replica must call it with the same position and world.
  void reshard(int64_t rank, int64_t world_size);

 private:
  void start_epoch();
  std::shared_ptr<const std::vector<uint32_t>> tokens_;
  LoaderOptions options_;
  int64_t num_windows_;
  int64_t windows_per_epoch_;  // this replica's share
  std::vector<uint64_t> order_;
  LoaderPosition position_;
};

}  // namespace tributary
