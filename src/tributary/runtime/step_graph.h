// train.cuda_graph: the training step captured once as a CUDA graph and replayed, so that a step costs one launch
// instead of the hundreds of small kernels a small model's step is made of (bench/bench_step_graph.cpp on an H200:
// the default model's step 2.4x (fp32) and 5.0x (bf16) faster than launched op by op; docs/benchmarks.md §26).
//
// The body it runs must launch device work only: no host reads (.item()), no host decisions on tensor values, and
// the same tensors (storage) every step; the step's inputs change by being written into tensors the body reads,
// which `stage` does before each run. The first `warmup` runs execute the body eagerly on the graph's stream (cuBLAS
// and the allocator set themselves up there), the next captures it and replays it, every later one replays it. The
// caller's stream waits for the step, so reading its outputs afterwards is ordered. Without a CUDA device the body
// simply runs each time: the same arithmetic, which the CPU tests check.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

namespace tributary {

class StepGraph {
 public:
  explicit StepGraph(torch::Device device, int warmup = 3);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // One step: `stage` (eager, every time: the inputs' copies), then the body, eagerly, captured or replayed.
  void run(const std::function<void()>& stage, const std::function<void()>& body);
  bool captured() const { return captured_; }

  // Whether this LibTorch can capture CUDA graphs (a CUDA build).
  static bool available();

 private:
  struct Cuda;  // the stream and the graph: CUDA types, kept out of this header
  torch::Device device_;
  int warmup_;
  int runs_ = 0;
  bool captured_ = false;
  std::unique_ptr<Cuda> cuda_;
};

}  // namespace tributary
