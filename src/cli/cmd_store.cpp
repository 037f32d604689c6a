// `tributary store --port P`: the run's store on its own, for multi-machine runs that must outlive any machine of
// workers, node 0's included (every `launch` then names it with --store ADDR:P). It holds the rendezvous, the
// membership of fault-tolerant runs and the process groups' bootstrap; it keeps nothing on disk and trains nothing.
#include <csignal>

#include "cli/commands.h"
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
  cmd->callback([port]() {
    sigset_t stop;  // blocked before any thread starts, so that sigwait below receives them
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    auto store = comm::Store::host(*port, std::chrono::seconds(60));
    log::info(
        "tributary store: serving on port {} (every interface; unauthenticated: keep it on a private network); "
        "start workers with `tributary launch --store ADDR:{} ...`; stop with Ctrl-C or SIGTERM",
        *port, *port);
    int sig = 0;
    sigwait(&stop, &sig);
    log::info("tributary store: stopping ({})", sig == SIGINT ? "SIGINT" : "SIGTERM");
  });
}

}  // namespace tributary::cli
