// dist.compute_nice: the training thread runs this much nicer than the threads that communicate, so that overlapped
// exchanges (DDP's buckets during backward, Streaming DiLoCo's fragments, asynchronous DiLoCo's posts, fetches and
// merges) progress when a machine has more workers than cores. Linux nice values are per thread and a new thread
// takes its creator's, so the trainer lowers its own thread once, after its sync started every thread it needs
// (communication threads, heartbeats, the asynchronous merger, Gloo's): those keep the old priority.
#pragma once

#include <cstdint>

namespace tributary {

// Lowers the calling thread's priority by `nice` (> 0; 0: nothing). A failure is logged naming `rank`, not thrown:
// the run goes on at the old priority.
void lower_training_priority(int64_t nice, int rank);

}  // namespace tributary
