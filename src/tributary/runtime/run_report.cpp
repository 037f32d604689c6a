#include "tributary/runtime/run_report.h"

#include <algorithm>
#include <cmath>

#include "tributary/core/log.h"

namespace tributary {
namespace {

std::string format_duration(double seconds) {
  int64_t s = static_cast<int64_t>(seconds);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}m{:02d}s", s / 60, s % 60);
}

}  // namespace

std::string thousands(double value) {
  std::string digits = std::to_string(static_cast<int64_t>(std::llround(value)));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

fs::path worker_lines_file(const fs::path& run_dir, int rank) {
  return run_dir / "workers" / fmt::format("rank{}.jsonl", rank);
}

RunReport::RunReport(const ReportSetup& setup) : setup_(setup), launched_world_(std::max(setup.world_size, 1)) {
  if (setup_.lead)
    metrics_ =
        std::make_unique<MetricsWriter>(setup_.run_dir / "metrics.jsonl", setup_.resume_step, setup_.run_dir / "tb");
  else if (!setup_.own_metrics.empty())
    metrics_ = std::make_unique<MetricsWriter>(setup_.run_dir / setup_.own_metrics, setup_.resume_step);
  if (setup_.distributed) {
    fs::create_directories(setup_.run_dir / "workers");
    worker_ =
        std::make_unique<MetricsWriter>(worker_lines_file(setup_.run_dir, setup_.rank), setup_.worker_resume_step);
  }
}

void RunReport::write(const nlohmann::json& line) {
  if (metrics_) metrics_->write(line.dump());
}

void RunReport::step_done(double seconds, int64_t tokens, std::optional<double> loss) {
  round_seconds_ += seconds;
  round_tokens_ += double(tokens);
  interval_seconds_ += seconds;
  train_s_ += seconds;
  interval_tokens_ += tokens;
  interval_steps_ += 1;
  if (!loss) return;
  interval_loss_ += *loss;
  interval_losses_ += 1;
}

void RunReport::take_lead(int64_t step) {
  setup_.lead = true;
  metrics_ = std::make_unique<MetricsWriter>(setup_.run_dir / "metrics.jsonl", step, setup_.run_dir / "tb");
}

void RunReport::exchange_done(int64_t step, int64_t outer_step, int64_t inner_steps, const comm::CommStats& c,
                              double elapsed, int world_size, int64_t rejected, const std::map<int, double>& scores) {
  round_comm_s_ += c.comm_s;
  // The training thread's blocked time since the last exchange can include waits outside the steps (the start's
  // identity check, a checkpoint's collectives): the round's compute is never below zero (a share of 116% blocked).
  const double compute_s = std::max(0.0, round_seconds_ - c.comm_s);
  nlohmann::json line = {{"step", step},
                         {"outer_step", outer_step},
                         {"bytes_sent", c.bytes_sent},
                         {"bytes_recv", c.bytes_recv},
                         {"comm_s", c.comm_s},
                         {"modelled_link_s", c.modelled_s},
                         {"compute_s", compute_s},
                         {"inner_steps", inner_steps},
                         {"elapsed_s", elapsed}};
  if (world_size > 0) line["world_size"] = world_size;
  if (rejected >= 0) line["rejected"] = rejected;
  if (!scores.empty()) {  // robust aggregation: each participant's cosine with the round's aggregate
    nlohmann::json by_participant = nlohmann::json::object();
    for (const auto& [id, score] : scores) by_participant[std::to_string(id)] = score;
    line["scores"] = by_participant;
  }
  write(line);
  if (world_size > 0) setup_.world_size = world_size;  // a fault-tolerant run's members from now on
  if (round_seconds_ > 0) last_round_tokens_per_s_ = round_tokens_ / round_seconds_;
  round_tokens_ = 0;
  if (worker_)
    worker_->write(nlohmann::json{
        {"step", step},
        {"outer_step", outer_step},
        {"comm_s", c.comm_s},
        {"compute_s", compute_s},
        {"bytes_sent", c.bytes_sent},
        {"elapsed_s",
         elapsed}}.dump());
  round_seconds_ = 0;
}

void RunReport::log_step(int64_t step, int64_t tokens_seen, const StepResult& result, double lr, double elapsed) {
  // A result that comes after the last step (local stages report late) has an empty interval.
  const double interval_tps = interval_seconds_ > 0 ? double(interval_tokens_) / interval_seconds_ : 0.0;
  const double tps = last_round_tokens_per_s_ > 0 ? last_round_tokens_per_s_ : interval_tps;
  // Above 1 only when the peak came out low (measured under load, with no better one kept): said once, shown as 100%.
  const double raw_mfu = tps * setup_.flops_per_token / (setup_.peak_flops * launched_world_);
  if (raw_mfu > 1 && !mfu_capped_said_ && setup_.lead) {
    log::warn(
        "MFU came out above 100% of the matmul peak ({:.1f} GFLOP/s per worker): the peak was measured while other "
        "work loaded this machine; MFU is shown as at most 100% (an idle run keeps a better peak for later runs)",
        setup_.peak_flops / 1e9);
    mfu_capped_said_ = true;
  }
  const double mfu = std::min(raw_mfu, 1.0);
  const double eta =
      interval_steps_ > 0
          ? double(std::max<int64_t>(0, (setup_.stops_at > 0 ? setup_.stops_at : setup_.total_steps) - step)) *
                interval_seconds_ / double(interval_steps_)
          : 0.0;
  const double loss_avg = interval_losses_ > 0 ? interval_loss_ / double(interval_losses_) : result.loss;
  const auto& chunk_losses = result.chunk_losses;
  nlohmann::json line = {{"step", step},
                         {"tokens", tokens_seen},
                         {"loss", result.loss},
                         {"loss_avg", loss_avg},
                         {"lr", lr},
                         {"grad_norm", result.grad_norm},
                         {"tokens_per_s", tps},
                         {"mfu", mfu},
                         {"elapsed_s", elapsed}};
  if (!chunk_losses.empty()) line["chunk_losses"] = chunk_losses;
  if (!result.stage_step_s.empty()) line["stage_step_s"] = result.stage_step_s;
  if (!result.stage_bytes_forward.empty()) line["stage_bytes_forward"] = result.stage_bytes_forward;
  write(line);
  if (worker_) {  // this worker alone: its share of the step's tokens over its own steps' time, against its share
    // of the launched workers' peak (a smaller world shares the same machines)
    const int members = std::max(setup_.world_size, 1);
    const double own = interval_tps / members;
    const double share = setup_.peak_flops * double(launched_world_) / double(members);
    worker_->write(nlohmann::json{
        {"step", step},
        {"tokens_per_s", own},
        {"mfu", std::min(1.0, own * setup_.flops_per_token / share)},
        {"loss_avg", loss_avg},
        {"elapsed_s",
         elapsed}}.dump());
  }
  const std::string chunks =
      chunk_losses.empty() ? std::string() : fmt::format(" (chunks at this step {:.3f})", fmt::join(chunk_losses, " "));
  const std::string comm_share =
      setup_.exchanges ? fmt::format(" | comm {:.0f}%", 100.0 * round_comm_s_ / std::max(interval_seconds_, 1e-9))
                       : std::string();
  round_comm_s_ = 0;
  if (setup_.lead)
    log::info("step {:>5}/{} | loss_avg {:.4f}{} | lr {:.2e} | grad {:.2f} | {} tok/s | MFU {:.1f}%{} | ETA {}", step,
              setup_.total_steps, loss_avg, chunks, lr, result.grad_norm, thousands(tps), 100 * mfu, comm_share,
              format_duration(eta));
  else if (setup_.machine_console)
    log::info("this machine: step {:>5}/{} | loss_avg {:.4f} | {} tok/s on this worker{} | ETA {}", step,
              setup_.total_steps, loss_avg, thousands(interval_tps / std::max(setup_.world_size, 1)), comm_share,
              format_duration(eta));
  interval_seconds_ = 0;
  interval_tokens_ = 0;
  interval_loss_ = 0;
  interval_steps_ = 0;
  interval_losses_ = 0;
}

void RunReport::evaluated(int64_t step, int64_t tokens_seen, const EvalResult& result, double elapsed, double eval_s,
                          TrainSummary& summary) {
  summary.val_loss = result.loss;
  summary.evaluated = true;
  summary.val_ppl = std::exp(result.loss);
  summary.val_bpb = result.loss / std::log(2.0) / setup_.bytes_per_token;
  write({{"step", step},
         {"tokens", tokens_seen},
         {"val_loss", result.loss},
         {"val_ppl", summary.val_ppl},
         {"val_bpb", summary.val_bpb},
         {"elapsed_s", elapsed},
         {"eval_s", eval_s},
         {"train_s", train_s_}});
  log::info("eval step {:>5} | val loss {:.4f} | ppl {:.2f} | {:.3f} bits/byte (unigram {:.3f})", step, result.loss,
            summary.val_ppl, summary.val_bpb, summary.unigram_bpb);
}

void RunReport::write_summary(const TrainSummary& s, const std::string& algorithm, const std::string& compression) {
  if (!setup_.lead) return;
  nlohmann::json j = {{"steps", s.steps},
                      {"tokens", s.tokens},
                      {"val_loss", s.val_loss},
                      {"val_bpb", s.val_bpb},
                      {"val_ppl", s.val_ppl},
                      {"unigram_bpb", s.unigram_bpb},
                      {"tokens_per_s", s.tokens_per_s},
                      {"mfu", s.mfu},
                      {"peak_flops", s.peak_flops},
                      {"peak_source", s.peak_source},
                      {"elapsed_s", s.elapsed_s},
                      {"num_parameters", s.num_parameters},
                      {"checkpoint", s.checkpoint.string()},
                      {"stopped_early", s.stopped_early},
                      {"world_size", s.world_size},
                      {"bytes_sent", s.bytes_sent},
                      {"bytes_recv", s.bytes_recv},
                      {"comm_s", s.comm_s},
                      {"outer_steps", s.outer_steps},
                      {"algorithm", algorithm},
                      {"rejected", s.rejected},
                      {"reformations", s.reformations},
                      {"compression", compression}};
  if (!s.stages.is_null()) j["stages"] = s.stages;
  if (s.islands > 0) {
    j["islands"] = s.islands;
    j["bytes_inside_island"] = s.bytes_inside;
  }
  if (!s.evaluated)
    for (const char* key : {"val_loss", "val_bpb", "val_ppl"}) j[key] = nullptr;
  if (s.details.is_object()) j.update(s.details);
  write_file_atomic(setup_.run_dir / "summary.json", j.dump(2) + "\n");
}

void forget_earlier_results(const fs::path& run_dir) {
  std::error_code ec;
  for (const char* name : {"summary.json", "report.html"}) fs::remove(run_dir / name, ec);
  if (!fs::is_directory(run_dir / "tb", ec)) return;
  for (const auto& entry : fs::directory_iterator(run_dir / "tb", ec))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) fs::remove(entry.path(), ec);
}

}  // namespace tributary
