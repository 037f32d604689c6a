// The replicas' rounds as a heal sees them (runtime/ft/admission.h asks; runtime/sync/replica_rounds.h answers): the
// lead reads the outer state and the units' progress to send, the joiner enters the phase at the lead's step and
// adopts them, and both check that what every member holds alike is identical. Asked only while no exchange is in
// flight (quiescent), except step_now, which names the step in log lines.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tributary/model/tensor_io.h"

namespace tributary {

class HealableRounds {
 public:
  // Nothing in flight: a heal may read or replace the state.
  virtual bool quiescent() const = 0;
  // The outer state every replica holds identically (empty for data parallel and during the warm-up), and per unit
  // its last sync and outer-step count.
  virtual NamedTensors outer_state() const = 0;
  virtual nlohmann::json progress() const = 0;
  // The joiner: the phase at `step` (data parallel, the warm-up, or DiLoCo), set up without checks; then the units'
  // progress the lead sent.
  virtual void enter(int64_t step, NamedTensors& params) = 0;
  virtual void adopt_progress(const nlohmann::json& progress) = 0;
  // The identity check on what every member holds alike (DiLoCo's global parameters, otherwise `params`); collective.
  virtual void check_identical(const NamedTensors& params, const std::string& when) = 0;
  // Past the warm-up: a joiner may be healed mid-round.
  virtual bool diloco_phase() const = 0;
  virtual int64_t step_now() const = 0;  // the training thread's step, for log lines

 protected:
  ~HealableRounds() = default;
};

}  // namespace tributary
