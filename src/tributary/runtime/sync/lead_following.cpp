#include "tributary/runtime/sync/lead_following.h"

#include <vector>

namespace tributary {

int64_t lead_says(comm::Group& group, int64_t mine) {
  if (group.size() == 1) return mine;
  std::vector<torch::Tensor> said = {torch::tensor({mine}, torch::kInt64)};
  group.broadcast(said, 0);
  return said[0][0].item<int64_t>();
}

int64_t follow_lead_loader(comm::Group& group, BatchLoader& loader, int64_t tokens_per_step, int64_t shard_offset) {
  if (group.size() == 1) return tokens_per_step;
  const LoaderPosition at = loader.position();
  std::vector<torch::Tensor> lead = {torch::tensor(
      {loader.rank(), loader.world_size(), int64_t(at.epoch), int64_t(at.cursor), tokens_per_step}, torch::kInt64)};
  group.broadcast(lead, 0);
  if (group.rank() == 0) return tokens_per_step;
  const auto v = lead[0];
  const int64_t rank = v[0].item<int64_t>() + shard_offset, world = v[1].item<int64_t>();
  if (loader.rank() != rank || loader.world_size() != world) loader.reshard(rank, world);
  loader.set_position({uint64_t(v[2].item<int64_t>()), uint64_t(v[3].item<int64_t>())});
  return v[4].item<int64_t>();
}

bool member_stop(comm::Group& group, bool local_stop, const std::function<bool(bool wish)>& vote) {
  std::vector<torch::Tensor> wish = {torch::tensor({int64_t(local_stop)})};
  if (group.size() > 1) group.all_reduce_sum(wish);
  const bool any = wish[0][0].item<int64_t>() > 0;
  return vote ? lead_says(group, vote(any)) != 0 : any;
}

}  // namespace tributary
