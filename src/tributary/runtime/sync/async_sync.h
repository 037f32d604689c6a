// A replica of asynchronous DiLoCo (dist.algorithm = async_diloco; Decoupled DiLoCo, Asynchronous Local-SGD): it never
// waits for another replica. Every dist.inner_steps steps it ends a round on its own:
//            (dist.round_seconds > 0: every round_seconds of training instead, time-paced: a fast replica's round
//            holds more steps, a slow one's fewer, and the update counts the tokens it trained on; every member's
//            rounds end at the same wall-clock boundaries, counted from the run's first second, so that their updates
//            meet in one merge instead of drifting into two half-round apart; -1: time-paced, the round lasting
//            dist.inner_steps steps of the median member, timed at start-up)
//   post     its pseudo-gradient since its anchor (anchor - theta: the parameters it last adopted or posted from)
//            goes to the update board (optim/update_board.h) on the communication thread, with the version it
//            trained from and its tokens; training goes on at once;
//   adopt    at any step at which a newer global version than its own has arrived (fetched in the background while
//            it trains), the replica continues from it plus its own progress that version has not merged yet: its
//            posted updates not in it, and its steps since its last post (theta = global - those). The global minus
//            its posts not merged becomes the anchor of its next update. A replica that took the bare global would
//            redo the progress its in-flight updates already carry, and the merges would apply it twice (measured:
//            the loss rose from 3.06 to 3.46 between steps 30 and 60 where synchronous DiLoCo fell to 2.50); one that
//            adopted only at its round's end drifted a round from the global (14% behind synchronous DiLoCo's loss
//            at equal tokens, 200 steps).
// The merge itself is optim/async_merger.h's, on whichever replica holds the merging term (every process is a
// candidate). Deaths need no agreement: a dead replica is absent from the merges, a restarted one (launch
// --max-restarts) starts from the newest committed version. A fast replica takes more rounds than a slow one; the
// run ends when the merges have taken in train.steps x replicas steps' tokens (AfterStep::over), so the wall time
// follows the fast replicas, not the slowest. Before an evaluation or the final checkpoint the lead adopts the newest
// version, so what it reads is the global model. No step is taken in lockstep: no stop vote (a signal stops the
// process that got it; the others go on) and no collective checkpoint (the lead writes the global model). A resume
// (--resume) starts every replica from the lead's checkpoint — its model, AdamW state, step and data position — as
// version 1 of a new board, whose merges go on from the momenta and the merged tokens the checkpoint kept: the run
// ends at the same token budget, and what the other replicas trained since their last merge is lost.
#pragma once

#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <optional>

#include "tributary/comm/comm_thread.h"
#include "tributary/optim/async_merger.h"
#include "tributary/optim/update_board.h"
#include "tributary/runtime/sync/round_pace.h"
#include "tributary/runtime/sync/sync.h"

namespace tributary {

// Who posts: a replica of the whole model is its launch rank; an island is one member spoken for by its rank 0
// (runtime/sync/island_sync.h), whose step trains its ranks' batches.
struct AsyncMember {
  int id = 0, count = 1;
  int64_t ranks = 1;                            // the ranks one step of the member trains on
  bool lead = false;                            // the run's lead: it reads and writes the global model
  std::optional<comm::LinkModel> links;         // the emulated links among the members, by id; none without dist.wan
  std::shared_ptr<comm::MessageSigner> signer;  // signs the board's posts, versions and terms (null: unsigned)
};

// A checkpoint's outer momenta of asynchronous DiLoCo ("<param>.outer_momentum"), written by the lead.
inline constexpr const char* kAsyncOuterFile = "async_outer.safetensors";

// Size: the member's place (id, links, signer, lead), its rounds' pace and the merge rules it hands its candidate, the
// version it descends from and the one fetched in the background, its updates in flight, and the overlap it reports.
class AsyncSync : public Sync {
 public:
  // The whole model's replicas: every launch rank is a member.
  explicit AsyncSync(const Session& session);
  AsyncSync(const Session& session, AsyncMember member);
  ~AsyncSync() override;

  Share share() const override;
  Started start(const StartState& state) override;  // the peak, then enter()
  // dist.round_seconds = -1: the round's length from every member's `step_seconds` (StartState::step_seconds), agreed
  // on the store; nothing otherwise. start() calls it; a sync that composes this one calls it before enter().
  void measure_pace(const std::function<double()>& step_seconds);
  // A resume: the merges go on from what the lead's checkpoint kept of them (an Error naming its state.json when it
  // is not asynchronous DiLoCo's). start() calls it; a sync that composes this one calls it before enter().
  void resume_from(const LoadedCheckpoint& ckpt);
  // Starts posting and merging from `trained` (version 1: every member initialised alike), or from the newest version
  // when one exists (a restarted member adopts it). A sync that composes this one (islands) calls it instead of
  // start().
  void enter(NamedTensors& trained);
  // dist.score = "loss": the merger enter() starts judges each merge's updates with `probe` (AsyncMerger::set_probe).
  // start() takes it from its StartState; a sync that composes this one calls it before enter().
  void judge_by_loss(ProbeMaker probe) { loss_probe_ = std::move(probe); }
  AfterStep after_step(int64_t step, double lr, NamedTensors& trained, bool last) override;
  void before_read(NamedTensors& params, NamedTensors* aux_params) override;
  // The lead's copy is the global model (before_read), with what a resume needs beside it: the version's outer
  // momenta (kAsyncOuterFile) and the tokens merged into it (state.json's "async"). Nobody else writes one.
  bool checkpoint_part(const fs::path& run_dir, int64_t step, const RankState& mine,
                       CheckpointContents& contents) override;
  void summarize(TrainSummary& summary) override;

 private:
  struct Fetched {
    int64_t version = 0;
    bool done = false;
    int64_t merged_mine = 0;  // this replica's posts numbered below this are in it (merged or refused)
    NamedTensors params;
  };
  // An update on its way or waiting to be merged: its delta stays until a version shows it merged.
  struct Posted {
    std::future<int64_t> sent;  // its number, once posted
    std::optional<int64_t> number;
    NamedTensors delta;
    int64_t at_step = 0;  // the replica's steps when it was posted
  };
  void post(NamedTensors& trained, int64_t steps);
  // The newest version when it is newer than `have` (none otherwise); on the communication thread. From `have`'s
  // parameters (exact) by the versions' steps when they are at hand, otherwise the whole version.
  std::optional<Fetched> fetch_newest(int64_t have, const NamedTensors& have_params);
  NamedTensors by_steps(int64_t have, const NamedTensors& have_params, int64_t version);  // empty: a step is gone
  // Takes what the background fetch brought and starts the next one.
  void poll_fetch();
  // `with_own`: plus this replica's posts the version has not merged (false: the bare global, at the run's end).
  void adopt(Fetched fetched, NamedTensors& trained, bool with_own = true);
  void collect_posts(bool all);  // posts sent (a failed one throws); `all`: waits for those still going
  void write_merge(const nlohmann::json& merge);

  const Session& session_;
  int rank_, replicas_;  // this member's id and the members' number
  std::optional<comm::LinkModel> links_;
  std::shared_ptr<comm::MessageSigner> signer_;
  ProbeMaker loss_probe_;  // judge_by_loss's
  bool lead_;
  int64_t tokens_per_step_;
  RoundPace pace_;  // when a round ends (by steps or by time)
  MergeRules rules_;
  comm::CommThread thread_;  // posts and fetches, off the training thread
  UpdateBoard board_;        // used on thread_ only
  std::unique_ptr<AsyncMerger> merger_;
  NamedTensors anchor_;             // fp32, CPU: what the next update is measured from
  NamedTensors global_;             // fp32, CPU: version base_ exactly (the next version's step applies to it)
  std::vector<std::string> names_;  // the trained parameters, in order: versions are read in it
  int64_t base_ = 1;                // the version the replica's parameters descend from
  std::deque<Posted> posts_;
  std::optional<std::future<std::optional<Fetched>>> fetch_;
  std::optional<Fetched> staged_;  // the newest version fetched, adopted at the next step's end
  bool over_ = false;
  std::optional<MergeStart> resumed_;  // a resumed run's version 1 (resume_from): its merged tokens and momenta
  int64_t rounds_ = 0, adopted_ = 0, steps_ = 0;
  // Its overlap: the steps trained from its own model between posting an update and adopting the version that merged
  // it, summed over the updates merged (what costs quality against synchronous DiLoCo, docs/benchmarks.md §46).
  int64_t overlap_steps_ = 0, overlapped_ = 0;
};

}  // namespace tributary
