// The supervision half of `tributary launch` (launcher.h): forwards the workers' output with rank prefixes, reaps
// them, stops the rest on a failure beyond --max-failures, and restarts a dead worker (--max-restarts) as a joiner
// while the others run. Internal to launch/launcher.cpp.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "tributary/launch/launcher.h"

namespace tributary {

struct Worker {
  int rank;
  pid_t pid;
  int fd;  // read end of the worker's stdout+stderr
  std::string partial;
  bool running = true;
  bool stopped = false;    // by SIGSTOP/SIGTSTP: alive, but its peers wait for it
  bool discarded = false;  // killed by launch to start its island again: its exit is no failure
  int status = 0;
};

// Forks local worker `local` again, as a joiner of the running run (TRIBUTARY_JOINING=1).
// `life`: the island's life the worker belongs to (--restart-island; 0 otherwise).
using Respawn = std::function<Worker(int local, int life)>;

// What a supervision ended with: the status launch exits with, or `start_again`: a worker was killed before the run
// got through start-up (nothing was trained; a crash, not a stop request or an error of its own, which would come
// back), with --max-restarts left — on this machine, or on another machine whose launch asked every launch through
// the store. The workers were stopped, and launch starts them again under the next attempt's keys (launcher.h).
// `restarts`: how many of --max-restarts are used, this one included.
struct Supervised {
  int status = 0;
  bool start_again = false;
  int restarts = 0;
};

// Runs until every worker exited. `restarts`: how many of --max-restarts earlier attempts used.
Supervised supervise(const LaunchOptions& options, std::vector<Worker>& workers, Respawn respawn, int restarts = 0);

}  // namespace tributary
