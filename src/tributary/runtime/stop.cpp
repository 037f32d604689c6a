#include "tributary/runtime/stop.h"

#include <csignal>

#include "tributary/core/log.h"

namespace tributary {
namespace {

volatile std::sig_atomic_t g_stop_requested = 0;
void on_signal(int) { g_stop_requested = 1; }

using Handler = void (*)(int);
Handler g_old_int = SIG_DFL, g_old_term = SIG_DFL;

}  // namespace

StopSignals::StopSignals() {
  g_stop_requested = 0;
  g_old_int = std::signal(SIGINT, on_signal);
  g_old_term = std::signal(SIGTERM, on_signal);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, g_old_int);
  std::signal(SIGTERM, g_old_term);
}

bool StopSignals::requested() const { return g_stop_requested != 0; }

bool StopAgreement::after_step(int64_t step, bool quiescent) {
  if (stop_after_step_ > 0 && step >= stop_after_step_) pending_ = true;
  if (!vote_) {
    pending_ |= signals_.requested();
  } else if (!pending_) {
    pending_ = vote_(signals_.requested());
    if (pending_ && lead_) log::info("stop agreed by every rank at step {}", step);
  }
  return pending_ && quiescent;
}

}  // namespace tributary
