// Pipeline stages against the single-process model (shared/reference/pipeline-and-local.md §3.2): ranks as threads,
// each with its own Gloo process groups over loopback TCP (the real engine, one process). p in {2, 3, 4}, GPipe and
// 1F1B(d = 0, 2), m in {1, p, 2p}: every stage's gradients equal the single-process gradients on the same batch
// (rtol 1e-5, atol 4e-5, PyTorch's pipelining tolerance), and after three optimizer steps (clipping on) the losses,
// gradient norms and parameters still match; the tied embedding copies stay bit-identical.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <map>
#include <thread>

#include "support/lcg_tokens.h"
#include "support/thread_ranks.h"
#include "support/tiny_model.h"
#include "tributary/comm/group.h"
#include "tributary/core/error.h"
#include "tributary/parallel/pipeline/pipeline_step.h"
#include "tributary/runtime/wan.h"

using namespace tributary;
using namespace tributary::pipeline;

namespace {

constexpr int64_t kBatch = 24, kSeed = 5;

ModelConfig tiny() { return test_support::tiny_model({.layers = 4, .levels = 2}); }

std::shared_ptr<const std::vector<uint32_t>> tokens() {
  static auto t = test_support::lcg_tokens(4000, 61, 7);
  return t;
}

BatchLoader loader() {
  return BatchLoader(tokens(), {.batch_size = kBatch, .context = tiny().context, .seed = 3}, "test");
}
const AdamWOptions kAdam{.weight_decay = 0.1};
constexpr double kClip = 0.5;
double lr(int64_t step) { return 3e-3 * double(step + 1); }

struct Reference {
  std::map<std::string, torch::Tensor> grads;  // after step 0's backward
  std::vector<double> losses, norms;
  std::map<std::string, torch::Tensor> params;  // after `steps`
};

Reference reference(int64_t steps) {
  torch::manual_seed(kSeed);
  Transformer model(tiny());
  auto params = named_parameters_of(model);
  AdamW adam(params, kAdam);
  auto data = loader();
  auto batch = torch::empty({kBatch, tiny().context + 1}, torch::kInt64);
  Reference r;
  for (int64_t s = 0; s < steps; ++s) {
    adam.zero_grad();
    data.next(batch.data_ptr<int64_t>());
    auto loss =
        Transformer::loss(model.forward(batch.narrow(1, 0, tiny().context)), batch.narrow(1, 1, tiny().context));
    loss.backward();
    if (s == 0)
      for (auto& [n, t] : params) r.grads[n] = t.grad().clone();
    r.losses.push_back(loss.item<double>());
    r.norms.push_back(clip_grad_norm(params, kClip));
    adam.step(lr(s));
  }
  for (auto& [n, t] : params) r.params[n] = t.detach().clone();
  return r;
}

// Runs every stage of one pipeline as a thread; `body(stage, step)` gets a ready PipelineStep.
// `wan`: emulated links on every group (runtime/wan.h spec), none if empty.
// `key_of(stage)`: the key each stage seals and opens its messages (and the tied embedding's sum) with (none: plain).
void run_pipeline(const ScheduleSpec& spec, const std::function<void(int64_t, PipelineStep&, NamedTensors&)>& body,
                  const std::string& wan = "", Wire wire = Wire::Fp32,
                  const std::function<comm::RunKey(int64_t)>& key_of = {}) {
  const int64_t p = spec.stages;
  const auto layout = StageLayout::balanced(tiny().num_layers, p);
  std::vector<std::shared_ptr<Transformer>> models;
  for (int64_t s = 0; s < p; ++s) {  // built here, in turn: the global RNG is not shared between threads
    torch::manual_seed(kSeed);
    models.push_back(std::make_shared<Transformer>(tiny()));
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  test_support::run_threads(int(p), [&](int rank) {
    const int64_t s = rank;
    auto options = [&](int n) { return comm::GroupOptions{.link = wan_link_model_or_none(wan, n)}; };
    comm::Group pipe(store, int(s), int(p), options(int(p)), "pipe");
    std::unique_ptr<comm::Group> tie;
    if (p > 1 && (s == 0 || s == p - 1))
      tie = std::make_unique<comm::Group>(store, s == 0 ? 0 : 1, 2, options(2), "tie");
    std::optional<comm::WireMac> mac;
    std::unique_ptr<comm::Exchange> tie_sealed;
    if (key_of) {
      mac.emplace(key_of(s));
      if (tie) tie_sealed = std::make_unique<comm::Exchange>(*tie, comm::ExchangeOptions{.mac_key = key_of(s)});
    }
    auto params = stage_params(named_parameters_of(*models[size_t(s)]), layout, s, tiny().blocks_per_level(), true);
    AdamW adam(params, kAdam);
    auto data = loader();
    PipelineStep step({*models[size_t(s)],
                       params,
                       adam,
                       data,
                       {&pipe, tie.get(), nullptr, -1, mac ? &*mac : nullptr, tie_sealed.get()},
                       spec,
                       layout,
                       s,
                       torch::kCPU,
                       kClip,
                       wire});
    body(s, step, params);
  });
}

}  // namespace

TEST(Pipeline, StagesEqualTheSingleProcessModel) {
  torch::set_num_threads(1);
  const Reference ref = reference(3);
  for (int64_t p : {2, 3, 4}) {
    for (int64_t m : {int64_t(1), p, 2 * p}) {
      for (auto [kind, d] : std::vector<std::pair<ScheduleKind, int64_t>>{
               {ScheduleKind::GPipe, 0}, {ScheduleKind::OneFOneB, 0}, {ScheduleKind::OneFOneB, 2}}) {
        const ScheduleSpec spec{kind, p, m, d};
        SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " 1f1b=" << int(kind) << " d=" << d);
        std::mutex mu;
        std::map<std::string, torch::Tensor> tied;
        run_pipeline(spec, [&](int64_t stage, PipelineStep& step, NamedTensors& params) {
          step.forward_backward(0);
          std::lock_guard<std::mutex> lock(mu);
          for (auto& [n, t] : params)
            EXPECT_TRUE(torch::allclose(t.grad(), ref.grads.at(n), 1e-5, 4e-5))
                << "stage " << stage << " " << n << " max diff "
                << (t.grad() - ref.grads.at(n)).abs().max().item<double>();
        });
        run_pipeline(spec, [&](int64_t stage, PipelineStep& step, NamedTensors& params) {
          for (int64_t s = 0; s < 3; ++s) {
            const StepResult r = step.run(s, lr(s));
            EXPECT_NEAR(r.loss, ref.losses[size_t(s)], 1e-6) << "step " << s;
            EXPECT_NEAR(r.grad_norm, ref.norms[size_t(s)], 1e-5 * ref.norms[size_t(s)]) << "step " << s;
          }
          std::lock_guard<std::mutex> lock(mu);
          for (auto& [n, t] : params) {
            EXPECT_TRUE(torch::allclose(t, ref.params.at(n), 1e-5, 4e-5))
                << "stage " << stage << " " << n << " max diff " << (t - ref.params.at(n)).abs().max().item<double>();
            if (n == kTiedEmbedding) {
              if (tied.count(n)) {
                EXPECT_TRUE(torch::equal(tied[n], t)) << "the tied copies diverged";
              }
              tied[n] = t.detach().clone();
            }
          }
        });
        if (p > 1) {
          EXPECT_EQ(tied.size(), 1u);
        }
      }
    }
  }
}

TEST(Pipeline, EmulatedLinksDelayTheStepsAndChangeNoNumber) {
  torch::set_num_threads(1);
  const Reference ref = reference(2);
  // Each step waits at least: an activation forward and a gradient back (40 ms each plus bytes), the tied-embedding
  // all-reduce and the loss/norm exchange (40 ms each).
  const auto start = std::chrono::steady_clock::now();
  run_pipeline(
      {ScheduleKind::OneFOneB, 2, 2, 0},
      [&](int64_t, PipelineStep& step, NamedTensors&) {
        for (int64_t s = 0; s < 2; ++s)
          EXPECT_NEAR(step.run(s, lr(s)).loss, ref.losses[size_t(s)], 1e-6) << "step " << s;
      },
      "8Mbit,40ms");
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2 * 0.16);
}

TEST(Pipeline, BadLayoutsAreRefusedNamingTheKey) {
  EXPECT_EQ(StageLayout::balanced(5, 2).first_block, (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(StageLayout::parse("1,4", 5, 2, "parallel.stage_layers").first_block, (std::vector<int64_t>{0, 1, 5}));
  for (const char* bad : {"1,3", "2,2,1", "0,5", "x,4", "2.5,2.5"}) {
    try {
      StageLayout::parse(bad, 5, 2, "parallel.stage_layers");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.stage_layers"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(StageLayout::balanced(2, 3), Error);
}

TEST(Pipeline, CompressedActivationsStayCloseAndSendFewerBytes) {
  // fp16 / bf16 / int8 / 4 and 2 bits on the wire: the gradients move by the rounding only (relative error well under
  // the size of one step's update; the 2-bit format's is large, as its error is), and the bytes sent are what the wire
  // format says: 2, C + 4, C / 2 + C / 16 or C / 4 + C / 16 bytes per token instead of 4 C.
  torch::set_num_threads(1);
  const Reference ref = reference(1);
  const int64_t tokens_per_mb = kBatch / 2 * tiny().context, C = tiny().width;
  for (auto [wire, tol] : std::vector<std::pair<Wire, double>>{{Wire::Fp16, 2e-3},
                                                               {Wire::Bf16, 2e-2},
                                                               {Wire::Int8, 2e-2},
                                                               {Wire::Hadamard4, 0.1},
                                                               {Wire::Hadamard2, 0.4}}) {
    SCOPED_TRACE(testing::Message() << "wire " << int(wire));
    std::mutex mu;
    run_pipeline(
        {ScheduleKind::GPipe, 2, 2, 0},
        [&](int64_t stage, PipelineStep& step, NamedTensors& params) {
          step.forward_backward(0);
          const auto stats = step.take_stats();
          std::lock_guard<std::mutex> lock(mu);
          EXPECT_EQ(stage == 0 ? stats.activation_bytes : stats.gradient_bytes, 2 * wire_bytes(wire, tokens_per_mb, C));
          double diff = 0, norm = 0;
          for (auto& [n, t] : params) {
            diff += (t.grad() - ref.grads.at(n)).pow(2).sum().item<double>();
            norm += ref.grads.at(n).pow(2).sum().item<double>();
          }
          EXPECT_LT(std::sqrt(diff / norm), tol) << "stage " << stage;
          if (stage == 1) {
            EXPECT_GT(diff, 0) << "the activations arrived exactly: nothing was compressed";
          }
        },
        "", wire);
  }
}

TEST(Pipeline, AqSgdSendsRevisitedExamplesAsChangesAndTheLastStageGetsNearlyExactActivations) {
  // aq4 over three epochs of the test data with the parameters held still (forward_backward only): from the second
  // visit of an example on, its activation travels as its change at 4 bits against what both stages cached, so it
  // arrives ever closer: the last stage's gradients match the single-process model's far closer than int8 on every
  // visit does (the bytes: activation_deltas_test.cpp; this model's 32 channels pad to one 64-value tile).
  torch::set_num_threads(1);
  constexpr int64_t kSteps = 40;
  std::map<std::string, torch::Tensor> want;  // the single-process gradients of the last step's batch
  {
    torch::manual_seed(kSeed);
    Transformer model(tiny());
    auto data = loader();
    auto batch = torch::empty({kBatch, tiny().context + 1}, torch::kInt64);
    for (int64_t s = 0; s < kSteps; ++s) data.next(batch.data_ptr<int64_t>());
    Transformer::loss(model.forward(batch.narrow(1, 0, tiny().context)), batch.narrow(1, 1, tiny().context)).backward();
    for (auto& [n, t] : named_parameters_of(model)) want[n] = t.grad().clone();
  }
  std::mutex mu;
  std::map<Wire, double> error;  // the last stage's gradients against the single-process model's
  for (Wire wire : {Wire::Int8, Wire::Aq4}) {
    run_pipeline(
        {ScheduleKind::GPipe, 2, 2, 0},
        [&](int64_t stage, PipelineStep& step, NamedTensors& params) {
          for (int64_t s = 0; s < kSteps; ++s) step.forward_backward(s);
          if (stage == 0) return;
          double diff = 0, norm = 0;
          for (auto& [n, t] : params) {
            if (n == kTiedEmbedding) continue;  // summed with stage 0's copy, whose gradient took 4-bit gradients
            diff += (t.grad() - want.at(n)).pow(2).sum().item<double>();
            norm += want.at(n).pow(2).sum().item<double>();
          }
          std::lock_guard<std::mutex> lock(mu);
          error[wire] = std::sqrt(diff / norm);
        },
        "", wire);
  }
  EXPECT_LT(error.at(Wire::Aq4), 5e-4);
  EXPECT_LT(error.at(Wire::Aq4) * 20, error.at(Wire::Int8)) << "int8 on every visit is far coarser";
}

TEST(Pipeline, SealedStageMessagesCarryTheSameValuesAndAStrangersAreRefused) {
  // With the run's key every activation and activation gradient carries a MAC (wire.h), and the tied embedding's
  // gradient is summed on the sealed ring: the stages compute what they compute without it, bit for bit, and 32 bytes
  // more a message; a stage that seals with another key (a stranger on the path between the stages) is refused by its
  // neighbour before anything it sent is used.
  torch::set_num_threads(1);
  const comm::RunKey ours = comm::random_run_key(), theirs = comm::random_run_key();
  const ScheduleSpec spec{ScheduleKind::OneFOneB, 2, 2, 0};
  std::mutex mu;
  std::map<int64_t, std::map<std::string, torch::Tensor>> plain;
  std::map<int64_t, int64_t> plain_bytes;
  run_pipeline(spec, [&](int64_t stage, PipelineStep& step, NamedTensors& params) {
    step.forward_backward(0);
    const auto stats = step.take_stats();
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [n, t] : params) plain[stage][n] = t.grad().clone();
    plain_bytes[stage] = stats.activation_bytes + stats.gradient_bytes;
  });
  run_pipeline(
      spec,
      [&](int64_t stage, PipelineStep& step, NamedTensors& params) {
        step.forward_backward(0);
        const auto stats = step.take_stats();
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [n, t] : params)
          EXPECT_TRUE(torch::equal(t.grad(), plain[stage][n])) << "stage " << stage << " " << n;
        EXPECT_EQ(stats.activation_bytes + stats.gradient_bytes, plain_bytes[stage] + 2 * comm::WireMac::kBytes);
      },
      "", Wire::Fp32, [&](int64_t) { return ours; });
  std::map<int64_t, std::string> errors;
  run_pipeline(
      spec,
      [&](int64_t stage, PipelineStep& step, NamedTensors&) {
        std::string error;
        try {
          step.forward_backward(0);
        } catch (const NetworkError& e) {
          error = e.what();
        }
        std::lock_guard<std::mutex> lock(mu);
        errors[stage] = error;
      },
      "", Wire::Fp32, [&](int64_t stage) { return stage == 0 ? theirs : ours; });
  EXPECT_NE(
      errors[1].find("activation of micro-batch 0 at step 1 from stage 0: the message does not carry the run's MAC"),
      std::string::npos)
      << errors[1];
}
