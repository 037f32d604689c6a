// The supervision half of `tributary launch` (launcher.h): forwards the workers' output with rank prefixes, reaps
// them, stops the rest on a failure beyond --max-failures, and restarts a dead worker (--max-restarts) as a joiner
// while the others run. Internal to runtime/launcher.cpp.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "tributary/runtime/launcher.h"

namespace tributary {

struct Worker {
  int rank;
  pid_t pid;
  int fd;  // read end of the worker's stdout+stderr
  std::string partial;
  bool running = true;
  bool stopped = false;  // by SIGSTOP/SIGTSTP: alive, but its peers wait for it
  int status = 0;
};

// Forks local worker `local` again, as a joiner of the running run (TRIBUTARY_JOINING=1).
using Respawn = std::function<Worker(int local)>;

// Runs until every worker exited; returns the status launch exits with.
int supervise(const LaunchOptions& options, std::vector<Worker>& workers, Respawn respawn);

}  // namespace tributary
