// `tributary plan --calibrate`: this machine's sustained training speed on the model a configuration trains, in the
// units of the scheduler's compute term (sched::Workload::tasklet_flops counts 6 x parameters x tokens), so that a
// cluster's `tflops` is measured on the real model rather than read off a data sheet. Run it on each kind of machine
// and write the number into the cluster file; devices without one take this machine's.
#pragma once

#include <string>

#include "tributary/config/run_config.h"

namespace tributary {

struct Calibration {
  double tflops = 0;  // median over the repeats
  double tflops_min = 0, tflops_max = 0;
  int repeats = 0;
  int64_t threads = 0;                // intra-op threads used (train.threads, as train sets them)
  int64_t sequences = 0, tokens = 0;  // one micro-batch: train.batch_size / parallel.micro_batches sequences
  double parameters = 0;
  std::string device;
};

// Times forward + backward of the configured model on one micro-batch of random tokens (after one warm-up), `repeats`
// times. Draws the model's initial weights from the global generator: call it in a process that trains nothing.
// Error naming the key for a device or vocabulary that cannot be had.
Calibration calibrate_speed(const RunConfig& config, int repeats = 5);

}  // namespace tributary
