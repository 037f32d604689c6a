// Path-local DiPaCo workers (dipaco.path_local, issue 16) with real processes: a worker holds and ships only its paths'
// modules (pseudo-gradients point to point to each module's owner, modules fetched through the run's store) and
// trains what the owners' ring trains; the workers need no shared run directory.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fmt/format.h>
#include <array>
#include <cmath>
#include <map>

#include <set>
#include <sstream>

#include "dipaco_fixture.h"
#include "tributary/artifacts/modules.h"
#include "tributary/comm/sparse_chunks.h"
#include "tributary/comm/wire_mac.h"
#include "tributary/launch/launcher.h"

using namespace tributary;
using namespace dipaco_test;

namespace {

// Every module's tensors agree within `atol` (measured: 2.4e-7 at most; the sums are grouped by worker and by owner
// differently: fp32 rounding).
void expect_same_modules(const DipacoRun& a, const DipacoRun& b, double atol) {
  for (const auto& id : a.grid.modules()) {
    const auto& x = a.modules.at(id);
    const auto& y = b.modules.at(id);
    ASSERT_EQ(x.size(), y.size()) << id;
    for (size_t k = 0; k < x.size(); ++k)
      EXPECT_LE((x[k].second - y[k].second).abs().max().item<double>(), atol) << id << " " << x[k].first;
  }
}

std::vector<nlohmann::json> lines_of(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(file));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// One worker's metrics of a path-local run, by round (1-based): the paths it trained, the modules they touched and the
// round's exchange line (bytes_up, bytes_state_got, ...).
struct WorkerRounds {
  std::map<int, std::set<int64_t>> paths;
  std::map<int, std::set<std::string>> touched;
  std::map<int, nlohmann::json> exchange;
};

WorkerRounds rounds_of(const fs::path& run, int worker, const PathGrid& grid) {
  WorkerRounds r;
  for (const auto& j : lines_of(run / (worker == 0 ? "metrics.jsonl" : fmt::format("metrics-rank{}.jsonl", worker)))) {
    if (j.contains("path")) {
      const int round = j["round"].get<int>() + 1;
      r.paths[round].insert(j["path"].get<int64_t>());
      for (const auto& m : grid.modules_of_path(j["path"].get<int64_t>())) r.touched[round].insert(m);
    }
    if (j.contains("outer_step")) r.exchange[j["round"].get<int>()] = j;
  }
  return r;
}

}  // namespace

TEST_F(Dipaco, PathLocalWorkersTrainLikeTheRingAndSendOnlyTheirPathsModules) {
  auto [rc, out] = sh(cli + " launch --nproc 2 --master-port 0 --" + dipaco("ring", "routes", ""));
  ASSERT_EQ(rc, 0) << out;
  auto [rc2, out2] =
      sh(cli + " launch --nproc 2 --master-port 0 --" + dipaco("local", "routes", "--set dipaco.path_local=true"));
  ASSERT_EQ(rc2, 0) << out2;
  const auto ring = load_dipaco_run(work() / "ring"), local = load_dipaco_run(work() / "local");
  EXPECT_EQ(local.round, 2);
  expect_same_modules(ring, local, 2e-6);

  // What each worker sent to the owners in each round, to the byte: the pseudo-gradient sums (fp32) and weights of the
  // modules its paths touched that another worker owns (module i is owned by worker i mod 2), plus one byte per
  // module for the touched-module mask.
  const auto ids = local.grid.modules();
  std::map<std::string, int64_t> numel;
  for (const auto& [id, tensors] : local.modules)
    for (const auto& [name, t] : tensors) numel[id] += t.numel();
  double ring_sent = 0, local_up = 0;
  for (int w : {0, 1}) {
    const WorkerRounds r = rounds_of(work() / "local", w, local.grid);
    ASSERT_EQ(r.exchange.size(), 2u) << "worker " << w;
    for (const auto& [round, line] : r.exchange) {
      // The mask, then one message of sums and one of weights to the other worker, each with its MAC (launch's key).
      const double mac = double(comm::WireMac::kBytes);
      double expected = double(ids.size()) + mac;
      bool sends = false;
      for (const auto& m : r.touched.at(round)) {
        const size_t i = size_t(std::find(ids.begin(), ids.end(), m) - ids.begin());
        if (int(i % 2) != w) expected += 4.0 * double(numel[m]) + 16, sends = true;
      }
      if (sends) expected += 2 * mac;
      EXPECT_EQ(line["bytes_up"].get<double>(), expected) << "worker " << w << ", round " << round;
      local_up += line["bytes_up"].get<double>();
    }
    for (const auto& [round, line] : rounds_of(work() / "ring", w, ring.grid).exchange)
      ring_sent += line["bytes_sent"].get<double>();
  }
  // The ring ships every module through every worker; a path-local worker only its paths' modules, once.
  EXPECT_LT(local_up, 0.75 * ring_sent) << local_up << " vs " << ring_sent;

  // Path state (dipaco.path_state = holder): in round 2 a worker fetches the AdamW state of each path it did not train
  // in round 1, from the worker that did, and nothing for the paths it trained again (it reads the state it saved
  // itself); it sends only the states the other asked it for. Beside that state only the holders' names and the
  // early-stopping records (a few dozen bytes of JSON per task) go through the store. Every path's state has the same
  // size. (With the state put into the store every task, a worker would send a state per task.)
  const double state_size = double(fs::file_size(work() / "local" / "inner" / "path-0.round-0.safetensors"));
  int again = 0;
  std::array<WorkerRounds, 2> r = {rounds_of(work() / "local", 0, local.grid),
                                   rounds_of(work() / "local", 1, local.grid)};
  for (int w : {0, 1}) {
    const double got = r[w].exchange.at(2)["bytes_state_got"].get<double>();
    const double put = r[w].exchange.at(2)["bytes_state_put"].get<double>();
    int moved = 0, served = 0;
    for (int64_t p : r[w].paths[2]) (r[w].paths[1].count(p) ? again : moved) += 1;
    for (int64_t p : r[1 - w].paths[2]) served += int(r[w].paths[1].count(p));
    const double records = 1000.0 * double(r[w].paths[2].size());
    EXPECT_GE(got, state_size * moved) << "worker " << w;
    EXPECT_LT(got, state_size * moved + records) << "worker " << w << ": " << moved << " path(s) new to it in round 2";
    EXPECT_GE(put, state_size * served) << "worker " << w;
    EXPECT_LT(put, state_size * served + records) << "worker " << w << ": " << served << " of its paths went on";
  }
  EXPECT_GT(again, 0) << "a worker claims the paths it trained last round first";
}

TEST_F(Dipaco, PathLocalWorkersNeedNoSharedRunDirectory) {
  // Two "machines" (one launch each, one worker each), each with its own run directory: inner AdamW state,
  // early-stopping copies and modules move through the run's store. The leader's directory ends with the whole run.
  // The run stops after round 1 and resumes, each worker in its own directory: worker 1 takes the round from the
  // leader, its modules from its own outer-state files, and puts its path state back into the new store. It trains
  // what the uninterrupted run with a shared directory trains (the inner state, momentum and early-stopping copies
  // carry over; lose any of them and the modules differ by far more than the tolerance).
  auto nodes = [&](const std::string& extra, bool path_local = true) {
    const int port = free_tcp_port();
    auto node = [&](int n) {
      return fmt::format(
          "{} launch --nnodes 2 --node-rank {} --nproc 1 --master-port {} --{}", cli, n, port,
          dipaco(fmt::format("node{}", n), "routes", fmt::format("--set dipaco.path_local={} ", path_local) + extra));
    };
    return sh("bash -c '" + node(0) + " & n0=$!; " + node(1) + "; rc=$?; wait $n0 || rc=1; exit $rc'");
  };
  // The owners' ring keeps the paths' state in one shared directory: apart, start-up finds it and the run goes
  // path-local, saying so (before: it refused to start). It trains what the ring trains on a shared directory.
  auto [rc_ring, out_ring] = nodes("", false);
  ASSERT_EQ(rc_ring, 0) << out_ring;
  EXPECT_NE(out_ring.find("is not shared with worker(s) 1"), std::string::npos) << out_ring;
  EXPECT_NE(out_ring.find("dipaco.path_local = false asks for the owners' ring"), std::string::npos) << out_ring;
  auto [rc_shared_ring, out_shared_ring] = sh(cli + " launch --nproc 2 --master-port 0 --" +
                                              dipaco("shared_ring", "routes", "--set dipaco.path_local=false"));
  ASSERT_EQ(rc_shared_ring, 0) << out_shared_ring;
  expect_same_modules(load_dipaco_run(work() / "shared_ring"), load_dipaco_run(work() / "node0"), 2e-6);
  auto [rc0, out0] = nodes("--stop-after-step 10");
  ASSERT_EQ(rc0, 0) << out0;
  EXPECT_NE(out0.find("path-local, each keeps its own"), std::string::npos) << out0;
  EXPECT_NE(out0.find("stopped after round 1"), std::string::npos) << out0;
  // Resumed with the leader 4x slower, worker 1 takes 3 of the 4 paths: at least one whose inner state and
  // early-stopping copy only the leader's directory holds.
  auto [rc, out] = nodes("--resume --set dist.slow_workers=0:4");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("DiPaCo: resuming after round 1"), std::string::npos) << out;
  auto [rc2, out2] =
      sh(cli + " launch --nproc 2 --master-port 0 --" + dipaco("shared", "routes", "--set dipaco.path_local=true"));
  ASSERT_EQ(rc2, 0) << out2;
  const auto apart = load_dipaco_run(work() / "node0"), shared = load_dipaco_run(work() / "shared");
  expect_same_modules(shared, apart, 2e-6);
  EXPECT_FALSE(fs::exists(work() / "node1" / "modules")) << "only the leader writes the module files";
  EXPECT_TRUE(fs::exists(work() / "node1" / "metrics-rank1.jsonl"));
  for (int64_t p = 0; p < apart.grid.num_paths(); ++p)
    EXPECT_TRUE(fs::exists(best_path_file(work() / "node0", p))) << "path " << p << "'s early-stopping copy";
  auto summary = [](const std::string& run) { return nlohmann::json::parse(read_file(work() / run / "summary.json")); };
  EXPECT_NEAR(summary("node0")["val_loss"].get<double>(), summary("shared")["val_loss"].get<double>(), 1e-4);
  EXPECT_NEAR(summary("node0")["val_loss_early_stopped"].get<double>(),
              summary("shared")["val_loss_early_stopped"].get<double>(), 1e-4);
}

TEST_F(Dipaco, APathLocalRunSurvivesTheDeathOfItsLeader) {
  // Worker 0 (the leader, owner of modules 0, 3) dies at its 12th inner step (round 1 or 2, as the queue dealt); the
  // others, waiting for its verdict, see its heartbeat stop, worker 1 decides and leads, the owners' modules pass on
  // with their published values, the lost tasks run again, and worker 1 writes the run's files. Before, the others
  // waited for the dead leader's verdict. The path state the dead leader held (dipaco.path_state = holder: AdamW state
  // of the paths it trained, early-stopping copies it made) dies with it: a task that needs it starts AdamW afresh, and
  // the next task of a path whose early-stopping copy it held makes a new copy (found: the re-run of the dead worker's
  // task equalled the dead copy's held-out loss, did not replace it, and the early-stopped evaluation lacked the path's
  // copy).
  auto [rc, out] = sh("TRIBUTARY_FAIL_RANK=0 TRIBUTARY_FAIL_STEP=12 " + cli +
                      " launch --nproc 3 --master-port 0 --max-failures 1 --" +
                      dipaco("leader_killed", "routes", "--set dipaco.path_local=true"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("worker 1 leads the run from round"), std::string::npos) << out;
  EXPECT_EQ(out.find("early-stopping copy was held by worker 0"), std::string::npos) << out;
  auto summary = nlohmann::json::parse(read_file(work() / "leader_killed" / "summary.json"));
  EXPECT_EQ(summary["rounds"].get<int64_t>(), 2);
  EXPECT_EQ(summary["tasks_dropped"].get<int64_t>(), 0);
  EXPECT_TRUE(std::isfinite(summary["val_loss_early_stopped"].get<double>()));
  EXPECT_EQ(load_dipaco_run(work() / "leader_killed").round, 2);
  // metrics.jsonl has every round once, the dead leader's and then the new one's, and the change of lead.
  std::vector<int64_t> rounds;
  bool lead_event = false;
  for (const auto& j : lines_of(work() / "leader_killed" / "metrics.jsonl")) {
    if (j.contains("outer_step")) rounds.push_back(j["outer_step"].get<int64_t>());
    lead_event |= j.value("event", "") == "lead";
  }
  EXPECT_EQ(rounds, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(lead_event);
}

TEST_F(Dipaco, APathLocalRunSurvivesADeathDuringTheExchange) {
  // Worker 2 dies in round 1's exchange, after the others entered it. Nobody applies that exchange (an owner applies
  // only once a verdict after the exchange finds every member alive); the dead worker's tasks run again, its modules
  // pass to a survivor, and the exchange runs again with two workers. Before, the round failed with a NetworkError.
  // Round 1 is the run's first: a new owner's momentum is zero as it would be anyway, and every path state the dead
  // worker held belonged to its discarded tasks, so the run trains what one process trains (fp32 sums grouped
  // otherwise: the tolerance of the ring comparison).
  auto [rc, out] = sh("TRIBUTARY_FAIL_RANK=2 TRIBUTARY_FAIL_EXCHANGE=1 " + cli +
                      " launch --nproc 3 --master-port 0 --max-failures 1 --" +
                      dipaco("exchange_killed", "routes", "--set dipaco.path_local=true"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("a worker died during the exchange"), std::string::npos) << out;
  EXPECT_NE(out.find("it runs again with worker(s) 0, 1"), std::string::npos) << out;
  auto [rc1, out1] = sh(cli + dipaco("one_process", "routes", "--set dipaco.path_local=true"));
  ASSERT_EQ(rc1, 0) << out1;
  const auto survived = load_dipaco_run(work() / "exchange_killed"), one = load_dipaco_run(work() / "one_process");
  EXPECT_EQ(survived.round, 2);
  expect_same_modules(one, survived, 2e-6);
  const auto summary = nlohmann::json::parse(read_file(work() / "exchange_killed" / "summary.json"));
  EXPECT_EQ(summary["tasks_dropped"].get<int64_t>(), 0);
}

TEST_F(Dipaco, ARingRunSurvivesTheDeathOfItsLeader) {
  // The owners' ring (every worker holds every module) through the same settle and leader switch: worker 0 dies in
  // round 2, worker 1 decides, leads and writes the module files; the dead worker's task runs again.
  auto [rc, out] =
      sh("TRIBUTARY_FAIL_RANK=0 TRIBUTARY_FAIL_STEP=12 " + cli +
         " launch --nproc 3 --master-port 0 --max-failures 1 --" + dipaco("ring_leader_killed", "routes", ""));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("worker 1 leads the run from round"), std::string::npos) << out;
  EXPECT_NE(out.find("continuing with 2 worker(s): 1, 2"), std::string::npos) << out;
  auto summary = nlohmann::json::parse(read_file(work() / "ring_leader_killed" / "summary.json"));
  EXPECT_EQ(summary["rounds"].get<int64_t>(), 2);
  EXPECT_EQ(summary["tasks_dropped"].get<int64_t>(), 0);
  EXPECT_TRUE(std::isfinite(summary["val_loss"].get<double>()));
  EXPECT_EQ(load_dipaco_run(work() / "ring_leader_killed").round, 2);
  // The new lead continues metrics.jsonl (runtime/ft/lead.h, as the trainer's does): the change of lead, then the
  // round it led.
  bool lead_event = false, round_two = false;
  std::istringstream metrics(read_file(work() / "ring_leader_killed" / "metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    lead_event |= j.value("event", "") == "lead" && j.value("lead_worker", -1) == 1;
    round_two |= j.contains("tasks") && j.value("round", 0) == 2;
  }
  EXPECT_TRUE(lead_event);
  EXPECT_TRUE(round_two) << "the round the new lead led is in metrics.jsonl";
}

TEST_F(Dipaco, PathLocalSparseLoCoSendsPackedTopKAndResumesItsFeedback) {
  // SparseLoCo per module (optim/module_feedback.h): each worker's upload is the packed top-16 of every 4,096 values of
  // the touched modules it does not own, to the byte; its error feedback is checkpointed each round and taken back by
  // --resume. The owners' ring, top-k and PowerSGD are refused naming what to change.
  // Also the path state put into the store every task (dipaco.path_state = store), resumed from each worker's files.
  const std::string sparse =
      "--set dipaco.path_local=true --set dist.compression=sparseloco --set dist.sparse_topk=16 "
      "--set dipaco.path_state=store ";
  auto [rc0, out0] =
      sh(cli + " launch --nproc 2 --master-port 0 --" + dipaco("sparse", "routes", sparse + "--stop-after-step 10"));
  ASSERT_EQ(rc0, 0) << out0;
  for (int w : {0, 1})
    EXPECT_TRUE(fs::exists(work() / "sparse" / "outer" / fmt::format("feedback-worker-{}.round-1.safetensors", w)))
        << w;
  auto [rc, out] = sh(cli + " launch --nproc 2 --master-port 0 --" + dipaco("sparse", "routes", sparse + "--resume"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("DiPaCo: resuming after round 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("feedback starts from zero"), std::string::npos) << out;
  // Worker 1 owns no stem: it sent something in round 1, so it has feedback to take back.
  EXPECT_NE(out.find("worker 1: SparseLoCo's error feedback of"), std::string::npos) << out;
  EXPECT_EQ(out.find("worker 1: SparseLoCo's error feedback of 0 module"), std::string::npos) << out;

  const auto run = load_dipaco_run(work() / "sparse");
  EXPECT_EQ(run.round, 2);
  const auto ids = run.grid.modules();
  std::map<std::string, int64_t> numel;
  for (const auto& [id, tensors] : run.modules)
    for (const auto& [name, t] : tensors) numel[id] += t.numel();
  const comm::SparseChunks chunks({.chunk = 4096, .k = 16, .bits = 2});
  const double state_size = double(fs::file_size(work() / "sparse" / "inner" / "path-0.round-0.safetensors"));
  for (int w : {0, 1}) {
    WorkerRounds r = rounds_of(work() / "sparse", w, run.grid);
    ASSERT_EQ(r.exchange.size(), 2u) << w;
    for (const auto& [round, line] : r.exchange) {
      const double bytes = line["bytes_up"].get<double>();
      int64_t values = 0, modules = 0;
      for (const auto& m : r.touched[round]) {
        const size_t i = size_t(std::find(ids.begin(), ids.end(), m) - ids.begin());
        if (int(i % 2) != w) values += numel[m], ++modules;
      }
      const double payload = modules > 0 ? double(chunks.payload_bytes(values)) : 0.0;
      const double macs = double(comm::WireMac::kBytes) * (modules > 0 ? 3 : 1);  // the mask's, the sums', the weights'
      EXPECT_EQ(bytes, double(ids.size()) + payload + 16.0 * double(modules) + macs)
          << "worker " << w << ", round " << round;
      if (modules > 0) {
        EXPECT_LT(payload, 0.02 * 4.0 * double(values));  // vs fp32: 16 of 4,096 values, 14 bits each
      }
      EXPECT_GE(line["bytes_state_put"].get<double>(), state_size * double(r.paths[round].size()))
          << "worker " << w << ", round " << round << ": every task's AdamW state goes into the store";
    }
  }
  const auto summary = nlohmann::json::parse(read_file(work() / "sparse" / "summary.json"));
  EXPECT_TRUE(std::isfinite(summary["val_loss"].get<double>()));

  auto [rc1, out1] = sh(cli + dipaco("sparse_ring", "routes", "--set dist.compression=sparseloco"));
  EXPECT_NE(rc1, 0);
  EXPECT_NE(out1.find("needs dipaco.path_local = true"), std::string::npos) << out1;
  auto [rc2, out2] = sh(cli + dipaco("topk", "routes", "--set dipaco.path_local=true --set dist.compression=topk"));
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("use 'sparseloco' with dipaco.path_local = true"), std::string::npos) << out2;
}
