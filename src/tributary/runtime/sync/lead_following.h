// A fault-tolerant member of several ranks — an island (island_sync.h), a pipeline (pipeline_sync.h) — is spoken for
// by its rank 0 in the run's quorum; its other ranks follow that lead over the member's own group. What they follow,
// for both kinds: a word of the lead's (a round due, a heal), the data shard and position, and the stop.
#pragma once

#include <cstdint>
#include <functional>

#include "tributary/comm/group.h"
#include "tributary/data/loader.h"

namespace tributary {

// The lead's `mine` (group rank 0's), on every rank of `group`. Collective.
int64_t lead_says(comm::Group& group, int64_t mine);
// The other ranks read the windows of the lead's shard (+ `shard_offset`: an island's ranks each read their own next
// to it; a pipeline's stages the lead's own) at its position, and take its tokens per step (returned; the lead's own
// on the lead). Collective.
int64_t follow_lead_loader(comm::Group& group, BatchLoader& loader, int64_t tokens_per_step, int64_t shard_offset);
// Any rank's wish to stop is the member's; `vote` (the lead's vote in the quorum's rounds; called on every rank, only
// the lead's answer counts) decides, told to every rank; without one the wish is the decision. Collective.
bool member_stop(comm::Group& group, bool local_stop, const std::function<bool(bool wish)>& vote);

}  // namespace tributary
