#include "tributary/parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "tributary/core/error.h"

namespace tributary::pipeline {

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvAct:
      return "recv-activation";
    case Op::Forward:
      return "forward";
    case Op::SendAct:
      return "send-activation";
    case Op::RecvGrad:
      return "recv-gradient";
    case Op::Backward:
      return "backward";
    case Op::SendGrad:
      return "send-gradient";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& text, const std::string& key) {
  if (text == "gpipe") return ScheduleKind::GPipe;
  if (text == "1f1b") return ScheduleKind::OneFOneB;
  fail("{} = '{}' is not a pipeline schedule: use gpipe or 1f1b", key, text);
}

int64_t warmup_forwards(const ScheduleSpec& s, int64_t stage) {
  if (s.kind == ScheduleKind::GPipe) return s.micro_batches;
  return std::min(s.micro_batches, (s.stages - 1 - stage) * (1 + s.warmup_margin));
}

int64_t peak_activations(const ScheduleSpec& s, int64_t stage) {
  return std::min(s.micro_batches, warmup_forwards(s, stage) + 1);
}

std::vector<Action> stage_actions(const ScheduleSpec& s, int64_t stage) {
  TRIB_CHECK(s.stages >= 1 && s.micro_batches >= 1 && stage >= 0 && stage < s.stages);
  const bool first = stage == 0, last = stage == s.stages - 1;
  std::vector<Action> out;
  auto forward = [&](int64_t mb) {
    if (!first) out.push_back({Op::RecvAct, mb});
    out.push_back({Op::Forward, mb});
    if (!last) out.push_back({Op::SendAct, mb});
  };
  auto backward = [&](int64_t mb) {
    if (!last) out.push_back({Op::RecvGrad, mb});
    out.push_back({Op::Backward, mb});
    if (!first) out.push_back({Op::SendGrad, mb});
  };
  const int64_t m = s.micro_batches, w = warmup_forwards(s, stage);
  for (int64_t mb = 0; mb < w; ++mb) forward(mb);
  for (int64_t k = 0; k < m - w; ++k) {  // steady state: one forward, one backward
    forward(w + k);
    backward(k);
  }
  for (int64_t mb = m - w; mb < m; ++mb) backward(mb);  // cool-down
  return out;
}

double DryRun::idle_fraction() const {
  double total = 0;
  for (double b : busy) total += b;
  return busy.empty() || makespan <= 0 ? 0 : 1.0 - total / (double(busy.size()) * makespan);
}

namespace {

// A message in flight: (from stage, to stage, is gradient, micro-batch) -> arrival time.
using MessageKey = std::tuple<int64_t, int64_t, bool, int64_t>;

struct StageState {
  std::vector<Action> actions;
  size_t next = 0;
  double clock = 0;
  int64_t held = 0;
};

}  // namespace

DryRun dry_run(const ScheduleSpec& spec, const DryRunCosts& costs) {
  std::vector<std::vector<Action>> lists;
  for (int64_t i = 0; i < spec.stages; ++i) lists.push_back(stage_actions(spec, i));
  return dry_run(lists, costs);
}

DryRun dry_run(const std::vector<std::vector<Action>>& stage_lists, const DryRunCosts& costs) {
  const auto p = static_cast<int64_t>(stage_lists.size());
  std::vector<StageState> stages(static_cast<size_t>(p));
  for (int64_t i = 0; i < p; ++i) stages[size_t(i)].actions = stage_lists[size_t(i)];
  DryRun out;
  out.busy.assign(size_t(p), 0.0);
  out.peak_held.assign(size_t(p), 0);
  std::map<MessageKey, double> in_flight;
  std::map<std::pair<int64_t, int64_t>, double> link_free;  // directed link -> when its queue empties
  for (;;) {
    // The stage whose next action can start earliest goes first (a receive starts when its message has arrived).
    int64_t pick = -1;
    double pick_start = std::numeric_limits<double>::infinity();
    bool all_done = true;
    for (int64_t i = 0; i < p; ++i) {
      auto& st = stages[size_t(i)];
      if (st.next >= st.actions.size()) continue;
      all_done = false;
      const Action a = st.actions[st.next];
      double start = st.clock;
      if (a.op == Op::RecvAct || a.op == Op::RecvGrad) {
        const bool grad = a.op == Op::RecvGrad;
        auto it = in_flight.find({grad ? i + 1 : i - 1, i, grad, a.mb});
        if (it == in_flight.end()) continue;
        start = std::max(start, it->second);
      }
      if (start < pick_start) pick = i, pick_start = start;
    }
    if (all_done) break;
    if (pick < 0) {
      out.deadlock = true;
      for (int64_t i = 0; i < p; ++i) {
        const auto& st = stages[size_t(i)];
        if (st.next < st.actions.size())
          out.why += fmt::format("stage {} waits in {} of micro-batch {}; ", i, op_name(st.actions[st.next].op),
                                 st.actions[st.next].mb);
      }
      return out;
    }
    auto& st = stages[size_t(pick)];
    const Action a = st.actions[st.next++];
    st.clock = pick_start;
    switch (a.op) {
      case Op::RecvAct:
      case Op::RecvGrad:
        in_flight.erase({a.op == Op::RecvGrad ? pick + 1 : pick - 1, pick, a.op == Op::RecvGrad, a.mb});
        break;
      case Op::Forward:
        st.clock += costs.t_forward;
        out.busy[size_t(pick)] += costs.t_forward;
        out.peak_held[size_t(pick)] = std::max(out.peak_held[size_t(pick)], ++st.held);
        break;
      case Op::Backward:
        st.clock += costs.t_backward;
        out.busy[size_t(pick)] += costs.t_backward;
        --st.held;
        break;
      case Op::SendAct:
      case Op::SendGrad: {
        const bool grad = a.op == Op::SendGrad;
        const int64_t to = grad ? pick - 1 : pick + 1;
        double& free_at = link_free[{pick, to}];
        free_at = std::max(st.clock, free_at) + costs.transfer;
        if (!in_flight.emplace(MessageKey{pick, to, grad, a.mb}, free_at + costs.latency).second) {
          out.deadlock = true;
          out.why = fmt::format("stage {} sends {} of micro-batch {} twice", pick, op_name(a.op), a.mb);
          return out;
        }
        ++out.messages;
        break;
      }
    }
    out.makespan = std::max(out.makespan, st.clock);
  }
  if (!in_flight.empty()) {
    out.deadlock = true;
    out.why = fmt::format("{} message(s) sent and never received", in_flight.size());
  }
  return out;
}

}  // namespace tributary::pipeline
