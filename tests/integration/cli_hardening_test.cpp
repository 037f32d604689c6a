// Issue 12: the CLI as a careless or hostile user drives it. Every bad flag ends in exit 2 with one [ERROR] line and
// no signal; path names are never executed; user limits are user errors.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "shell.h"
#include "test_paths.h"  // generated: TRIBUTARY_CLI, TRIBUTARY_SOURCE_DIR, ...
#include "tributary/core/fs.h"
#include "tributary/core/hash.h"

using namespace tributary;

namespace {

// One directory per test process: CTest runs this suite's tests as parallel processes.
fs::path work_dir() { return fs::temp_directory_path() / ("trib_cli_hardening_" + std::to_string(::getpid())); }

// The shell's exit status: >= 128 means the CLI died by a signal. `timeout` turns a hang into 124.
std::pair<int, std::string> cli(const std::string& args) {
  return test_support::run_shell("cd " + work_dir().string() + " && timeout 120 " + std::string(TRIBUTARY_CLI) + " " +
                                 args);
}

int error_lines(const std::string& out) {
  int n = 0;
  for (size_t p = out.find("[ERROR]"); p != std::string::npos; p = out.find("[ERROR]", p + 1)) ++n;
  return n;
}

class CliHardening : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { fs::remove_all(work_dir()); }
  static void SetUpTestSuite() {
    fs::remove_all(work_dir());
    fs::create_directories(work_dir());
    const std::string data = test_support::test_data_dir((work_dir() / "data").string());
    if (!fs::exists(fs::path(data) / "dataset.json")) {
      auto [rc, out] = cli("data build-default --out " + data + " --mb-per-domain 0.1 --val-permille 50");
      ASSERT_EQ(rc, 0) << out;
    }
    auto [rc, out] =
        cli("train --set model.num_layers=1 --set model.width=32 --set model.num_heads=2 "
            "--set model.context=32 --set train.batch_size=2 --set train.steps=2 --set train.threads=1 "
            "--set train.eval_every=0 --set optim.warmup_steps=1 --set data.dir=" +
            data + " --set train.run_dir=run");
    ASSERT_EQ(rc, 0) << out;
  }
};

// Exit 2, exactly one [ERROR] line, and the message names what was wrong.
void expect_user_error(const std::string& args, const std::string& names) {
  auto [rc, out] = cli(args);
  EXPECT_EQ(rc, 2) << args << "\n" << out;
  EXPECT_EQ(error_lines(out), 1) << args << "\n" << out;
  EXPECT_NE(out.find(names), std::string::npos) << args << "\n" << out;
}

TEST_F(CliHardening, PlotNeverRunsCommandsFromPathNames) {
  // --out with gnuplot syntax in it: written literally as that file name
  const std::string evil_out = "x.png'; system('touch PWNED'); print '";
  auto [rc, out] = cli("plot run --out \"" + evil_out + "\"");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_FALSE(fs::exists(work_dir() / "PWNED"));
  EXPECT_TRUE(fs::exists(work_dir() / evil_out));
  // a run directory named like a shell command
  const std::string evil_run = "r';touch PWNED2;'";
  fs::copy(work_dir() / "run", work_dir() / evil_run, fs::copy_options::recursive);
  std::tie(rc, out) = cli("plot \"" + evil_run + "\"");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_FALSE(fs::exists(work_dir() / "PWNED2"));
  EXPECT_TRUE(fs::exists(work_dir() / evil_run / "loss.png"));
  // gnuplot missing: said plainly
  std::tie(rc, out) = test_support::run_shell("cd " + work_dir().string() + " && PATH=/nonexistent " +
                                              std::string(TRIBUTARY_CLI) + " plot run");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("gnuplot"), std::string::npos) << out;
}

TEST_F(CliHardening, PlotDrawsNoValidationCurveForARunWithoutEvaluations) {
  // Issue 66, item 8: without evaluation lines `plot` drew the train loss a second time, titled "validation loss".
  // A gnuplot on PATH that keeps the script it was given shows what would be drawn.
  const auto bin = work_dir() / "fake-gnuplot";
  fs::create_directories(bin);
  write_file(bin / "gnuplot", "#!/bin/sh\ncp \"$1\" \"$GP_COPY\"\n", false);
  fs::permissions(bin / "gnuplot", fs::perms::owner_all);
  const auto run = work_dir() / "no-evals";
  fs::create_directories(run);
  write_file(run / "metrics.jsonl",
             "{\"step\":5,\"tokens\":640,\"loss\":4.1,\"loss_avg\":4.2}\n"
             "{\"step\":10,\"tokens\":1280,\"loss\":3.9,\"loss_avg\":4.0}\n",
             false);
  auto plot = [&](const std::string& out) {
    return test_support::run_shell("PATH=" + bin.string() + ":$PATH GP_COPY=" + (run / "seen.gp").string() + " " +
                                   std::string(TRIBUTARY_CLI) + " plot " + run.string() + " --overwrite --out " +
                                   (run / out).string());
  };
  auto [rc, out] = plot("a.png");
  ASSERT_EQ(rc, 0) << out;
  std::string seen = read_file(run / "seen.gp");
  EXPECT_NE(seen.find("train loss"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("validation loss"), std::string::npos) << seen;
  // With an evaluation line the validation curve is drawn from it.
  write_file(run / "metrics.jsonl",
             read_file(run / "metrics.jsonl") + "{\"step\":10,\"tokens\":1280,\"val_loss\":3.95}\n", false);
  std::tie(rc, out) = plot("b.png");
  ASSERT_EQ(rc, 0) << out;
  seen = read_file(run / "seen.gp");
  EXPECT_NE(seen.find("validation loss"), std::string::npos) << seen;
}

TEST_F(CliHardening, TheStoreTakesTheRunSecretAndSaysWhomItServes) {
  // Issue 66, item 13: `tributary store` had no --secret-file and said "unauthenticated" even when
  // TRIBUTARY_SECRET_FILE gave it a key.
  write_file(work_dir() / "store.secret", "the store's secret", false);
  auto first_line = [&](const std::string& env, const std::string& flags) {
    const int port = 20000 + int(::getpid() % 20000);
    return test_support::run_shell(fmt::format(
        "cd {}; {} {} store --port {} {} > store.log 2>&1 & p=$!; "
        "for i in $(seq 100); do grep -q serving store.log && break; kill -0 $p 2>/dev/null || break; sleep 0.1; "
        "done; kill $p; wait $p; cat store.log",
        work_dir().string(), env, TRIBUTARY_CLI, port, flags));
  };
  auto [rc, out] = first_line("", "--secret-file store.secret");
  EXPECT_NE(out.find("only clients that prove the run's secret"), std::string::npos) << out;
  std::tie(rc, out) = first_line("TRIBUTARY_SECRET_FILE=store.secret", "");
  EXPECT_NE(out.find("only clients that prove the run's secret"), std::string::npos) << out;
  std::tie(rc, out) = first_line("", "");
  EXPECT_NE(out.find("unauthenticated"), std::string::npos) << out;
  // A secret file that is not there: one line naming it, exit 2.
  std::tie(rc, out) = first_line("", "--secret-file nowhere.secret");
  EXPECT_NE(out.find("--secret-file 'nowhere.secret'"), std::string::npos) << out;
  EXPECT_EQ(out.find("serving"), std::string::npos) << out;
}

TEST_F(CliHardening, DataBuildRefusesToDeleteAndNeverEatsItsInput) {
  fs::create_directories(work_dir() / "victim");
  std::ofstream(work_dir() / "victim" / "thesis.txt") << "thesis";
  std::ofstream(work_dir() / "good.jsonl") << R"({"text": "hello"})" << "\n";
  expect_user_error("data build good.jsonl --out victim", "not a Tributary dataset");
  EXPECT_EQ(read_file(work_dir() / "victim" / "thesis.txt"), "thesis");
  fs::create_directories(work_dir() / "texts");
  std::ofstream(work_dir() / "texts" / "a.txt") << "some text";
  expect_user_error("data build texts/ --out texts/", "overlaps the input");
  EXPECT_EQ(read_file(work_dir() / "texts" / "a.txt"), "some text");
  expect_user_error("data build-default --out victim", "not a Tributary dataset");
}

TEST_F(CliHardening, UserLimitsAreUserErrorsNotCrashes) {
  expect_user_error("eval run --batch-size 0", "--batch-size");
  expect_user_error("plan case5-worldwide gpt3-xl --population 0", "--population");
  expect_user_error("plan case5-worldwide gpt3-xl --d-dp 128 --d-pp 1", "d_dp");
  {
    std::ofstream f(work_dir() / "big.json");
    f << R"({"regions": [{"name": "a", "devices": 1024}], "latency_ms": [[1]], "bandwidth_gbps": [[1]]})";
  }
  expect_user_error("plan big.json gpt3-xl --d-dp 128 --d-pp 8", "limit of 64");
  {
    std::ofstream f(work_dir() / "huge.json");
    f << R"({"regions": [{"name": "a", "devices": 2000000}], "latency_ms": [[1]], "bandwidth_gbps": [[1]]})";
  }
  expect_user_error("plan huge.json", "huge.json");
  {
    std::ofstream f(work_dir() / "typed.json");
    f << R"({"regions": [{"name": "a", "devices": 4, "tflops": "fast"}], "latency_ms": [[1]],
            "bandwidth_gbps": [[1]]})";
  }
  expect_user_error("plan typed.json", "typed.json");
  {
    std::ofstream f(work_dir() / "workload.json");
    f << R"({"name": 3, "num_layers": 24})";
  }
  expect_user_error("plan case5-worldwide workload.json", "workload.json");
  fs::create_directories(work_dir() / "outdir");
  expect_user_error("plan case1-datacenter-on-demand --out outdir", "is a directory");
  for (const auto& e : fs::directory_iterator(work_dir()))
    EXPECT_EQ(e.path().filename().string().find("outdir.tmp-"), std::string::npos) << e.path();
  {
    std::ofstream f(work_dir() / "kept.json");
    f << "mine";
  }
  expect_user_error("plan case1-datacenter-on-demand --out kept.json", "pass --overwrite");
  EXPECT_EQ(read_file(work_dir() / "kept.json"), "mine") << "an existing --out is refused, not replaced";
  // The worker's command without launch's `--` is explained, not only refused (issue 45, item 7).
  expect_user_error("launch --nproc 2 train cfg.toml --set train.steps=4",
                    "launch takes the worker's command after `--`");
  expect_user_error("eval run --prefix 32", "--prefix");
  expect_user_error("generate run --temperature nan", "--temperature");
  expect_user_error("generate run --tokens 99999999999999999999", "--tokens");
  expect_user_error("generate run --threads 100000", "--threads");
  expect_user_error("train --stop-after-step -1", "--stop-after-step");
  expect_user_error("train " + work_dir().string(), "is a directory");
  expect_user_error("launch --nproc 2 --grace -1 -- train", "--grace");
  expect_user_error("launch --nproc 2 --max-failures -1 -- train", "--max-failures");
  expect_user_error("launch --nproc 1 --master-addr no.such.host.invalid -- plan case1-datacenter-on-demand",
                    "cannot resolve --master-addr");
  std::ofstream(work_dir() / "afile") << "x";
  const std::string tiny_train = "train --set train.steps=1 --set optim.warmup_steps=0 --set data.dir=" +
                                 test_support::test_data_dir((work_dir() / "data").string());
  expect_user_error(tiny_train + " --set train.run_dir=afile", "is a file");
  expect_user_error(tiny_train + " --set train.run_dir=/proc/trib_run", "cannot create train.run_dir");
  expect_user_error("eval", "checkpoint");  // a CLI11 parse error: exit 2 with an [ERROR] line, not 106
  {  // the CPU tensor cache's cap comes from the environment: a bad one is named, before anything runs
    auto [rc, out] = test_support::run_shell(
        "cd " + work_dir().string() + " && TRIBUTARY_CPU_CACHE_MB=lots timeout 120 " + TRIBUTARY_CLI + " eval run");
    EXPECT_EQ(rc, 2) << out;
    EXPECT_EQ(error_lines(out), 1) << out;
    EXPECT_NE(out.find("TRIBUTARY_CPU_CACHE_MB='lots'"), std::string::npos) << out;
  }
}

// Every numeric flag of every subcommand at 0, negative and huge (and NaN and infinity for the real-valued ones; an
// integer flag refuses NaN where it refuses a number too large for it, when parsing): never a signal or a hang; a
// refusal is exit 2 with exactly one [ERROR] line. Values a flag legitimately takes (0 threads = all cores) may run to
// completion. "{}" in a command marks where the flag goes (launch's own flags come before --).
void sweep(const std::vector<std::pair<std::string, std::vector<std::string>>>& flags, int min_refused) {
  const std::vector<std::string> values = {"0", "-1", "99999999999999999999"};
  const std::vector<std::string> real_valued = {"--temperature", "--budget", "--grace", "--mb-per-domain"};
  int refused = 0, ran = 0;
  for (const auto& [base, names] : flags)
    for (const auto& flag : names) {
      auto vs = values;
      if (std::find(real_valued.begin(), real_valued.end(), flag) != real_valued.end())
        vs.insert(vs.end(), {"nan", "inf"});
      for (const auto& v : vs) {
        std::string args = base;
        const std::string f = flag + " " + v;
        if (auto at = args.find("{}"); at != std::string::npos)
          args.replace(at, 2, f);
        else
          args += " " + f;
        auto [rc, out] = cli(args);
        EXPECT_LT(rc, 124) << args << " died by a signal or hung (exit " << rc << ")\n" << out;
        if (rc != 0) {
          ++refused;
          EXPECT_EQ(rc, 2) << args << "\n" << out;
          EXPECT_EQ(error_lines(out), 1) << args << "\n" << out;
        } else {
          ++ran;
          EXPECT_EQ(error_lines(out), 0) << args << "\n" << out;
        }
      }
    }
  EXPECT_GE(refused, min_refused);  // the sweep must actually exercise refusals
  std::printf("sweep: %d refused, %d ran\n", refused, ran);
}

TEST_F(CliHardening, NumericFlagSweepEvalGenerate) {
  sweep({{"eval run --batches 1", {"--batch-size", "--threads", "--prefix", "--units", "--reroute-every"}},
         {"eval run", {"--batches"}},
         {"generate run --tokens 2", {"--temperature", "--top-k", "--seed", "--threads", "--path"}},
         {"generate run", {"--tokens"}}},
        20);
}

TEST_F(CliHardening, NumericFlagSweepPlanTrainLaunchData) {
  const std::string worker = " -- plan case1-datacenter-on-demand --budget 0.05 --random 1";
  sweep({{"plan case1-datacenter-on-demand --budget 0.05 --random 10",
          {"--shuffle-ids", "--seed", "--offspring", "--population", "--islands", "--d-dp", "--d-pp"}},
         {"plan case1-datacenter-on-demand --random 10", {"--budget"}},
         {"plan case1-datacenter-on-demand --budget 0.05", {"--random"}},
         {"train --set train.steps=1", {"--stop-after-step"}},
         {"launch --nproc 1 {}" + worker, {"--nnodes", "--node-rank", "--master-port", "--grace", "--max-failures"}},
         {"launch {}" + worker, {"--nproc"}},
         {"data build-default --out sweep_ds --overwrite", {"--mb-per-domain", "--val-permille", "--vocab-size"}}},
        45);
}

}  // namespace

TEST_F(CliHardening, HelpConfigWithAConfigShowsItsValuesAndMarksWhatDiffers) {
  // Issue 45, item 7: `train CFG --help-config` ignored CFG and listed the defaults.
  const std::string cfg = std::string(TRIBUTARY_SOURCE_DIR) + "/configs/diloco.toml";
  auto [rc, out] = cli("train " + cfg + " --set train.steps=700 --help-config");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("* train.steps                  = 700 "), std::string::npos) << out;
  EXPECT_NE(out.find("* train.run_dir                = 'runs/diloco'"), std::string::npos) << out;
  EXPECT_NE(out.find("  train.seed "), std::string::npos) << "a key left at its default is not marked\n" << out;
  // Issue 45, item 7: help shows every option's default, and its bounds in words (not CLI11's "INT in [0 - 2^63-1]").
  auto [rc_help, help] = cli("eval --help");
  ASSERT_EQ(rc_help, 0) << help;
  EXPECT_NE(help.find("--device TEXT (default cpu)"), std::string::npos) << help;
  EXPECT_NE(help.find("--batch-size INT (1 to 1048576; default 16)"), std::string::npos) << help;
  EXPECT_NE(help.find("--batches INT (at least 0; default 0)"), std::string::npos) << help;
  EXPECT_NE(help.find("--split TEXT ({train,val}; default val)"), std::string::npos) << help;
  for (const char* command : {"train", "eval", "generate", "data build", "plan", "launch", "export", "route"}) {
    auto [rc_c, text] = cli(std::string(command) + " --help");
    EXPECT_EQ(rc_c, 0) << command << ": " << text;
    EXPECT_EQ(text.find(" in ["), std::string::npos) << command << ": " << text;
  }
  auto [rc2, plain] = cli("train --help-config");
  ASSERT_EQ(rc2, 0) << plain;
  EXPECT_EQ(plain.find("* "), std::string::npos) << plain;
  EXPECT_NE(plain.find("  train.steps "), std::string::npos) << plain;
}

TEST_F(CliHardening, ResumeBeforeTheConfigTakesItAsTheConfig) {
  // Issue 45, item 7: `train --resume CFG` gave CFG to --resume, and the run failed as if CFG were a checkpoint.
  {
    std::ofstream f(work_dir() / "cfg.toml");
    f << "[model]\nnum_layers = 1\nwidth = 32\nnum_heads = 2\ncontext = 32\n"
         "[optim]\nwarmup_steps = 1\n"
         "[train]\nbatch_size = 2\nsteps = 3\nthreads = 1\neval_every = 0\nrun_dir = \"resumed\"\n"
         "[data]\ndir = \""
      << test_support::test_data_dir((work_dir() / "data").string()) << "\"\n";
  }
  auto [rc0, out0] = cli("train cfg.toml --stop-after-step 1");
  ASSERT_EQ(rc0, 0) << out0;
  auto [rc, out] = cli("train --resume cfg.toml");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("--resume cfg.toml: a config file, not a checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("done: 3 steps"), std::string::npos) << out;
}

TEST_F(CliHardening, DataBuildWarnsWhenADomainGetsNoValidationDocument) {
  // Issue 45, item 8: documents go to the validation split by their hash, so a small domain may get none, silently.
  fs::create_directories(work_dir() / "domains" / "big");
  fs::create_directories(work_dir() / "domains" / "small");
  int val = 0, train = 0;
  for (int i = 0; val == 0 || train < 20; ++i) {  // the big domain: validation and training documents
    const std::string text = fmt::format("document {} of the big domain, with some words in it", i);
    (hash64(text) % 1000 < 50 ? val : train) += 1;
    std::ofstream(work_dir() / "domains" / "big" / fmt::format("{}.txt", i)) << text;
  }
  for (int i = 0;; ++i) {  // the small domain: one document, which the hash puts in the training split
    const std::string text = fmt::format("the only document of the small domain, number {}", i);
    if (hash64(text) % 1000 < 50) continue;
    std::ofstream(work_dir() / "domains" / "small" / "only.txt") << text;
    break;
  }
  auto [rc, out] = cli("data build domains/ --out domains_ds --val-permille 50");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("domain 'small' has no validation document (1 document(s), val_permille = 50)"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("domain 'big' has no validation document"), std::string::npos) << out;
  // ... and SentencePiece trains without its own log lines in the output (it printed its whole command line)
  std::tie(rc, out) = cli("data build domains/ --out domains_spm --tokenizer sentencepiece --vocab-size 300");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("training SentencePiece"), std::string::npos) << out;
  EXPECT_EQ(out.find("LOG("), std::string::npos) << out;
  EXPECT_EQ(out.find("sentencepiece_trainer"), std::string::npos) << out;
}

TEST_F(CliHardening, PlanSitesProposesIslandsFromTheRegionsAndRefusesSplitRegions) {
  auto [rc, out] = cli(std::string("plan ") + TRIBUTARY_SOURCE_DIR + "/configs/examples/cluster.json --sites");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("berlin           2 device(s): ranks 0..1"), std::string::npos) << out;
  EXPECT_NE(out.find("--set parallel.islands=2,2"), std::string::npos) << out;
  EXPECT_NE(out.find("launch --nproc 2 --nnodes 2"), std::string::npos) << out;
  // The same islands as a file for parallel.placement; an existing file is not overwritten unasked.
  const std::string plan_out =
      std::string("plan ") + TRIBUTARY_SOURCE_DIR + "/configs/examples/cluster.json --sites --out islands.json";
  std::tie(rc, out) = cli(plan_out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(read_file(work_dir() / "islands.json").find(R"("islands": [)"), std::string::npos);
  expect_user_error(plan_out, "islands.json");
  {
    std::ofstream f(work_dir() / "split.json");
    f << R"({"latency_ms": [[0, 1, 1], [1, 0, 1], [1, 1, 0]], "bandwidth_gbps": [[10, 1, 1], [1, 10, 1], [1, 1, 10]],
             "device_regions": ["a", "b", "a"]})";
  }
  expect_user_error("plan split.json --sites", "region 'a' has devices 0 and 2");
}

TEST_F(CliHardening, APortInUseIsNamedWithWhatToDo) {
  // Issue 45, item 7: a port in use printed raw library lines; now one line that names the port and the way out.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  auto [rc, out] = cli(fmt::format("store --port {}", port));
  EXPECT_NE(rc, 0) << out;
  EXPECT_EQ(error_lines(out), 1) << out;
  EXPECT_NE(out.find(fmt::format("cannot host the run's store on port {}: another program", port)), std::string::npos)
      << out;
  std::tie(rc, out) = cli(fmt::format("launch --nproc 1 --master-port {} -- train --help-config", port));
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("choose another port"), std::string::npos) << out;
  ::close(fd);
}

TEST_F(CliHardening, ANamedOutputThatExistsIsReplacedOnlyWithOverwrite) {
  // Issue 45, item 7: every output path refuses to overwrite without --overwrite (report and plot wrote over it).
  for (const char* name : {"mine.html", "mine.png"}) {
    std::ofstream(work_dir() / name) << "mine";
    const std::string command = std::string(name).ends_with(".html") ? "report" : "plot";
    expect_user_error(command + " run --out " + name, "--out '" + std::string(name) + "' already exists");
    EXPECT_EQ(read_file(work_dir() / name), "mine") << command;
    auto [rc, out] = cli(command + " run --out " + name + " --overwrite");
    EXPECT_EQ(rc, 0) << command << ": " << out;
    EXPECT_NE(read_file(work_dir() / name), "mine") << command;
  }
  // a command's own file in the run directory is its output: written again
  EXPECT_EQ(cli("report run").first, 0);
  EXPECT_EQ(cli("report run").first, 0);
}

TEST_F(CliHardening, HostileOutputsAndHandEditedFilesAreUserErrorsNotBugs) {
  // Issue 46, item 8: status 3 (our bug) for --out naming a device, a file or a dangling link, an --out under /proc,
  // a checkpoint manifest or a summary.json of another JSON shape. Each is status 2 with one line naming it.
  ASSERT_EQ(cli("export run --format hf --out hf").first, 0);
  std::ofstream(work_dir() / "a_file") << "";
  fs::create_symlink(work_dir() / "nowhere", work_dir() / "dangling");
  for (const std::string out : {"/dev/null", "a_file", "dangling"}) {
    expect_user_error("export run --format hf --out " + out, "is not a directory");
    expect_user_error("import hf --out " + out, "is not a directory");
  }
  expect_user_error("data build-default --mb-per-domain 0.05 --out /proc/tributary-test", "/proc/tributary-test");
  // a hand-edited run directory
  fs::copy(work_dir() / "run", work_dir() / "edited", fs::copy_options::recursive);
  fs::path ckpt;
  for (const auto& e : fs::directory_iterator(work_dir() / "edited" / "checkpoints")) ckpt = e.path();
  std::ofstream(ckpt / "manifest.json") << "[1, 2]";
  expect_user_error("eval edited", "is not a valid checkpoint manifest");
  std::ofstream(ckpt / "manifest.json")
      << R"({"format": "tributary-checkpoint", "files": {"../../../../etc/passwd": {"bytes": 1, "xxh64": "0"}}})";
  expect_user_error("eval edited", "entry '../../../../etc/passwd' is not a file of the checkpoint");
  std::ofstream(work_dir() / "edited" / "summary.json") << R"({"algorithm": 5, "val_loss": "low"})";
  expect_user_error("report edited --out edited.html", "has a JSON type train never writes");
  EXPECT_FALSE(fs::exists(work_dir() / "edited.html"));
}

TEST_F(CliHardening, EvalRefusesFlagsThatDoNotApplyToItsCheckpoint) {
  // Issue 46, item 9: eval ignored flags of another kind of run (DiPaCo's on a dense run, units without --prefix).
  expect_user_error("eval run --early-stopped", "eval --early-stopped: applies to DiPaCo runs only");
  expect_user_error("eval run --reroute-every 4", "eval --reroute-every: applies to DiPaCo runs only");
  expect_user_error("eval run --units 5", "eval --units: counts units");
  expect_user_error("eval run --prefix 8 --batches 3", "eval --batches: does not apply with --prefix");
  EXPECT_EQ(cli("eval run --prefix 8 --units 5").first, 0);
}

// Issue 66, item 15: `train /dev/zero` ran out of memory (exit 3, std::bad_alloc), and train.run_dir = "/" was
// accepted and, as root, wrote the run's files into the filesystem's root.
TEST_F(CliHardening, AConfigThatIsNoFileAndARunDirectoryThatIsNoRunsAreRefused) {
  const std::string data = test_support::test_data_dir((work_dir() / "data").string());
  const std::string tiny =
      " --set model.num_layers=1 --set model.width=32 --set model.num_heads=2 --set model.context=32 "
      "--set train.batch_size=2 --set train.steps=2 --set train.threads=1 --set train.eval_every=0 "
      "--set optim.warmup_steps=1 --set data.dir=" +
      data;
  expect_user_error("train /dev/zero", "config file '/dev/zero' is not a regular file");
  expect_user_error("train no-such.toml", "config file 'no-such.toml' does not exist");
  const bool root_was_clean = !fs::exists("/summary.json") && !fs::exists("/metrics.jsonl");
  expect_user_error("train" + tiny + " --set train.run_dir=/", "train.run_dir = '/' is a filesystem root");
  if (root_was_clean)
    for (const char* leftover : {"/summary.json", "/metrics.jsonl", "/config.toml"}) {
      EXPECT_FALSE(fs::exists(leftover)) << leftover << " written into the filesystem's root";
      fs::remove(leftover);  // the run wrote there: leave the machine as it was
    }
  fs::create_directories(work_dir() / "papers");
  write_file(work_dir() / "papers" / "notes.txt", "mine");
  expect_user_error("train" + tiny + " --set train.run_dir=papers", "holds files no run wrote (notes.txt)");
  EXPECT_FALSE(fs::exists(work_dir() / "papers" / "config.toml"));
  auto [rc, out] = cli("train --overwrite" + tiny + " --set train.run_dir=run");  // a run's own directory: fine
  EXPECT_EQ(rc, 0) << out;
}

// Issue 66, item 17: the ETA counted to train.steps when --stop-after-step ends the invocation sooner.
TEST_F(CliHardening, TheEtaCountsToTheStepTheInvocationStopsAt) {
  const std::string data = test_support::test_data_dir((work_dir() / "data").string());
  auto [rc, out] = cli(
      "train --overwrite --set model.num_layers=1 --set model.width=32 --set model.num_heads=2 --set model.context=32 "
      "--set train.batch_size=2 --set train.steps=1000000 --set train.threads=1 --set train.eval_every=0 "
      "--set train.log_every=2 --set optim.warmup_steps=1 --set train.run_dir=eta --set data.dir=" +
      data + " --stop-after-step 4");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step     2/1000000"), std::string::npos) << out;
  EXPECT_NE(out.find("| ETA 0m00s"), std::string::npos) << "two steps left, not 999,998: " << out;
}
