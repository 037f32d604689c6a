// `tributary store --port P`: the run's store on its own, for multi-machine runs that must outlive any machine of
// workers, node 0's included (every `launch` then names it with --store ADDR:P). It holds the rendezvous, the
// membership of fault-tolerant runs and the process groups' bootstrap; it keeps nothing on disk and trains nothing.
#include <csignal>
#include <cstdlib>

#include "cli/commands.h"
#include "tributary/comm/sealed_store.h"
#include "tributary/comm/store.h"
#include "tributary/core/error.h"
#include "tributary/core/log.h"

namespace tributary::cli {

void add_store(CLI::App& app) {
  auto port = std::make_shared<int>(0);
  auto* cmd = app.add_subcommand("store",
                                 "serve a run's store (launch --store ADDR:PORT on every machine) until "
                                 "SIGINT/SIGTERM");
  cmd->add_option("--port", *port, "TCP port to serve on (every interface)")->required()->check(CLI::Range(1, 65535));
  auto secret_file = std::make_shared<std::string>();
  cmd->add_option("--secret-file", *secret_file,
                  "the run's secret, the file every machine's launch names: the store serves only clients that prove "
                  "it (also TRIBUTARY_SECRET_FILE)");
  cmd->callback([port, secret_file]() {
    if (!secret_file->empty())
      ::setenv("TRIBUTARY_RUN_SECRET",
               comm::run_key_hex(comm::run_key_of_file(*secret_file, fmt::format("--secret-file '{}'", *secret_file)))
                   .c_str(),
               1);
    const bool proven = comm::run_key_from_environment().has_value();  // what Store::host serves with
    sigset_t stop;  // blocked before any thread starts, so that sigwait below receives them
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    auto store = comm::Store::host(*port, std::chrono::seconds(60));
    log::info(
        "tributary store: serving on port {} (every interface; {}); start workers with `tributary launch --store "
        "ADDR:{} ...`; stop with Ctrl-C or SIGTERM",
        *port,
        proven ? "only clients that prove the run's secret: give every launch the same --secret-file"
               : "unauthenticated: keep it on a private network, or give it and every launch --secret-file",
        *port);
    int sig = 0;
    sigwait(&stop, &sig);
    log::info("tributary store: stopping ({})", sig == SIGINT ? "SIGINT" : "SIGTERM");
  });
}

}  // namespace tributary::cli
