#include "tributary/runtime/training_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tributary/core/log.h"

namespace tributary {

void lower_training_priority(int64_t nice, int rank) {
  if (nice <= 0) return;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno != 0 || ::setpriority(PRIO_PROCESS, tid, now + static_cast<int>(nice)) != 0)
    log::warn("rank {}: could not lower the training thread's priority (dist.compute_nice = {}): {}", rank, nice,
              std::strerror(errno));
}

}  // namespace tributary
