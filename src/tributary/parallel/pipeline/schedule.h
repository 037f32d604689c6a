// Pipeline schedules as per-stage action lists (torch.distributed.pipelining's IR,
// shared/reference/pipeline-and-local.md §2.3): a stage runs its list in order; sends are asynchronous (waited at the
// end of the step), receives block. One executor (pipeline_step.h) runs any list; the dry run below checks a list set
// without processes.
//
//   gpipe      all forwards, then all backwards: m micro-batches' activations held per stage
//   1f1b(d)    w_i = min(m, (p-1-i)(1+d)) warm-up forwards, then one forward + one backward pairs, then the cool-down
//              backwards; d = 0 is Megatron's count (at most min(m, w_i+1) activations held), d > 0 trades memory for
//              tolerance of link latency (1F1B reaches GPipe's step time once d >= ceil(2L / (t_f + t_b))).
//
// Torch-free: the schedule is arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tributary::pipeline {

enum class Op : uint8_t { RecvAct, Forward, SendAct, RecvGrad, Backward, SendGrad };
const char* op_name(Op op);

struct Action {
  Op op;
  int64_t mb;  // micro-batch
};

enum class ScheduleKind { GPipe, OneFOneB };
ScheduleKind parse_schedule(const std::string& text, const std::string& key);  // "gpipe" | "1f1b"; Error naming key

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::GPipe;
  int64_t stages = 1;         // p
  int64_t micro_batches = 1;  // m
  int64_t warmup_margin = 0;  // d (1F1B only)
};

int64_t warmup_forwards(const ScheduleSpec& spec, int64_t stage);   // 1F1B's w_i (GPipe: m)
int64_t peak_activations(const ScheduleSpec& spec, int64_t stage);  // what the schedule promises to hold at most
std::vector<Action> stage_actions(const ScheduleSpec& spec, int64_t stage);

// A discrete-event dry run of every stage's list: forward t_f, backward t_b, each directed link a FIFO queue
// (arrival = max(sent, link free) + transfer, + latency). Sends never block; a receive waits for its message.
struct DryRunCosts {
  double t_forward = 1, t_backward = 2;
  double transfer = 0;  // per message, occupies the link
  double latency = 0;   // per message, does not
};
struct DryRun {
  bool deadlock = false;
  std::string why;  // the stuck stages and their next actions, or an unmatched message
  double makespan = 0;
  std::vector<double> busy;        // compute time per stage
  std::vector<int64_t> peak_held;  // most micro-batches forwarded and not yet backwarded, per stage
  int64_t messages = 0;
  double idle_fraction() const;  // 1 - sum(busy) / (p * makespan)
};
DryRun dry_run(const ScheduleSpec& spec, const DryRunCosts& costs = {});
DryRun dry_run(const std::vector<std::vector<Action>>& stage_lists, const DryRunCosts& costs = {});

}  // namespace tributary::pipeline
