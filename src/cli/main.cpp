#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include <unistd.h>

#include "cli/commands.h"
#include "cli/help_format.h"
#include "tributary/comm/store.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"
#include "tributary/model/cpu_allocator.h"
#include "tributary/perf/platform.h"

namespace {

// Workers started by torchrun report their error in the file it names, so the agent can show which rank failed why.
void report_to_torchelastic(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path) return;
  nlohmann::json j = {{"message", {{"message", message}, {"extraInfo", {{"py_callstack", ""}, {"timestamp", "0"}}}}}};
  std::ofstream(path) << j.dump();
}

// `launch` was given a worker's command without the `--` that separates it from launch's own options.
bool launch_without_separator(int argc, char** argv) {
  bool launch = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "launch") launch = true;
  }
  return launch;
}

// OpenMP's idle threads spin before they sleep (libgomp: 300,000 spins unless OMP_WAIT_POLICY or GOMP_SPINCOUNT say
// otherwise), and the runtime reads those variables once, as it loads, before main. On a machine whose cores are busy,
// the spinning threads of a short, bursty model run take each other's cores: `generate` under load took 2-28 s with the
// default against 1.6-2.7 s with 1,000 spins, at a cost of ~0.3 s on an idle machine (docs/benchmarks.md, "Threads on
// a shared machine"). So `generate` and `eval` run themselves again with GOMP_SPINCOUNT=1000 unless the user chose;
// `train` keeps the default, with which an idle machine trains 15-20% faster than with short spins.
void short_openmp_spins_for_inference(int argc, char** argv) {
  if (argc < 2 || std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  const std::string_view command = argv[1];
  if (command != "generate" && command != "eval") return;
  ::setenv("GOMP_SPINCOUNT", "1000", 1);
  ::execv("/proc/self/exe", argv);  // returns only when it failed: go on with the runtime's default
}

}  // namespace

int main(int argc, char** argv) {
  short_openmp_spins_for_inference(argc, argv);
  // A write to a socket whose peer died (Gloo's writev to a killed worker) must be an error the fault tolerance
  // handles, not SIGPIPE: a survivor of a kill died with status 141 that way in a test run. Python, which the
  // PyTorch peers run in, ignores SIGPIPE for the same reason.
  std::signal(SIGPIPE, SIG_IGN);
  tributary::comm::quiet_c10d_warnings();
  CLI::App app{"Tributary: training language models across poorly connected, unlike machines"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();                   // every option's help shows its default
  app.formatter(std::make_shared<tributary::cli::HelpFormatter>());  // before the commands: they copy it
  app.set_version_flag(
      "--version", [] { return tributary::platform_report(); },
      "Tributary's version, the LibTorch it runs on, its BLAS and threads, and CUDA devices");
  tributary::cli::add_train(app);
  tributary::cli::add_eval(app);
  tributary::cli::add_generate(app);
  tributary::cli::add_data(app);
  tributary::cli::add_plot(app);
  tributary::cli::add_plan(app);
  tributary::cli::add_launch(app);
  tributary::cli::add_store(app);
  tributary::cli::add_identity(app);
  tributary::cli::add_route(app);
  tributary::cli::add_export_path(app);
  tributary::cli::add_export(app);
  tributary::cli::add_import(app);
  tributary::cli::add_report(app);
  try {
    tributary::install_cpu_caching_allocator();  // before any tensor: see model/cpu_allocator.h
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);                            // --help, --version
    if (dynamic_cast<const CLI::RuntimeError*>(&e)) return e.get_exit_code();  // launch: the workers' exit status
    // A usage mistake is a user error like any other: one [ERROR] line, exit 2 (CLI11's own codes are 104-109).
    if (dynamic_cast<const CLI::ExtrasError*>(&e) && launch_without_separator(argc, argv)) {
      tributary::log::error(
          "{}: launch takes the worker's command after `--`, e.g. tributary launch --nproc 2 -- train CFG --set "
          "KEY=VALUE (without it, the worker's options read as launch's)",
          e.what());
      return 2;
    }
    tributary::log::error("{} (see --help)", e.what());
    return 2;
  } catch (const tributary::RunLost& e) {
    tributary::log::error("{}", e.what());
    report_to_torchelastic(e.what());
    return tributary::kRunLostStatus;
  } catch (const tributary::NetworkError& e) {
    // A peer or the network failed: often the echo of another rank's failure. Its own status lets `launch` blame
    // the rank that failed first for a reason of its own.
    tributary::log::error("{}", e.what());
    report_to_torchelastic(e.what());
    return tributary::kNetworkErrorStatus;
  } catch (const tributary::Error& e) {
    tributary::log::error("{}", e.what());
    report_to_torchelastic(e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user named that cannot be made or written (/proc, a read-only or full disk, no permission).
    tributary::log::error("{}: check that the path can be written (nothing else was changed)", e.what());
    report_to_torchelastic(e.what());
    return 2;
  } catch (const c10::Error& e) {
    tributary::log::error("{}", e.what_without_backtrace());
    report_to_torchelastic(e.what_without_backtrace());
    return 3;
  } catch (const std::exception& e) {
    tributary::log::error("{}", e.what());
    report_to_torchelastic(e.what());
    return 3;
  }
  return 0;
}
