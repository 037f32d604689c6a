// The islands of a run (parallel.islands): ranks joined by a fast link inside a slow world. Island i holds the
// consecutive ranks from begin(i); without islands every rank is an island of one. The outer exchange across the
// islands is cut into outer_shards() = the smallest island's size: rank r of an island exchanges shard r
// (r < outer_shards()) with rank r of every other island; the island's other ranks hold no outer state and receive
// the shards from their island. Time-paced islands (parallel.island_steps) take steps(i) optimizer steps per step of
// the loop (a tick); 1 everywhere in lockstep; with parallel.island_steps = "auto" the run measures them at start-up
// (paced_steps). Torch-free; a part of parallel/layout.h's Layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tributary {

// A value: its methods read it.
// Size: the questions the islands' groups, their outer shards and their pace ask, each a line; no state but the
// shape.
class IslandShape {
 public:
  IslandShape() = default;  // one island of one rank
  // sizes: ranks per island (they add up to the world); steps: optimizer steps per tick, one per island; rank: this
  // process's rank in the world.
  // measured: parallel.island_steps = "auto" (lockstep until the run measured the pace).
  // leads_exchange: the islands' ranks 0 exchange the whole model (one outer shard; dist.fault_tolerant, whose
  // members are the islands, each spoken for by its rank 0).
  IslandShape(std::vector<int64_t> sizes, std::vector<int64_t> steps, int rank, bool measured = false,
              bool leads_exchange = false);

  int64_t count() const { return int64_t(sizes_.size()); }
  int64_t island() const { return island_; }  // this rank's
  int64_t size(int64_t island) const { return sizes_[size_t(island)]; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  int begin(int64_t island) const;                                   // its first rank
  int64_t rank_in_island() const { return rank_ - begin(island_); }  // this rank's place in its island
  std::vector<int> ranks() const;                                    // this rank's island
  bool equal() const;                                                // every island of the same size
  int64_t outer_shards() const;
  int64_t outer_shard() const { return rank_in_island() < outer_shards() ? rank_in_island() : -1; }  // -1: none
  std::vector<int> outer_shard_ranks() const;  // the ranks that exchange this rank's shard, island by island
  int64_t steps(int64_t island) const { return steps_[size_t(island)]; }
  const std::vector<int64_t>& all_steps() const { return steps_; }
  int64_t steps_per_tick() const { return steps(island_); }  // this rank's island's
  bool measured_pace() const { return measured_; }           // the steps are to be measured at start-up
  bool leads_exchange() const { return leads_exchange_; }
  // The steps per tick that give every island's tick the length of the slowest island's one step: round(T_slowest /
  // T_i) within [1, kMaxPacedSteps], T_i the slowest step of island i's ranks (its data-parallel step waits for it).
  // `seconds`: every rank's measured step, in rank order. The same on every rank given the same `seconds`.
  static constexpr int64_t kMaxPacedSteps = 64;
  std::vector<int64_t> paced_steps(const std::vector<double>& seconds) const;
  // The batches of all islands in one tick, in ranks' batches: sum of size x steps (the world size in lockstep). An
  // island's pseudo-gradient stands for size x steps ranks' batches.
  int64_t batches_per_tick() const;

 private:
  std::vector<int64_t> sizes_{1}, steps_{1};
  int rank_ = 0;
  int64_t island_ = 0;
  bool measured_ = false;
  bool leads_exchange_ = false;
};

}  // namespace tributary
