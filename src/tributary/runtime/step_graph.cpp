#include "tributary/runtime/step_graph.h"

#include "tributary/core/error.h"

#ifdef TRIBUTARY_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace tributary {

#ifdef TRIBUTARY_WITH_CUDA
struct StepGraph::Cuda {
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAGraph graph;
  cudaEvent_t queued = nullptr, done = nullptr;
  explicit Cuda(c10::DeviceIndex index) : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  ~Cuda() {
    cudaEventDestroy(queued);
    cudaEventDestroy(done);
  }
  // `waiter` runs nothing more until `on` has finished what it has queued so far.
  static void wait(cudaEvent_t event, const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
    C10_CUDA_CHECK(cudaEventRecord(event, on.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(waiter.stream(), event, 0));
  }
};
#else
struct StepGraph::Cuda {};
#endif

bool StepGraph::available() {
#ifdef TRIBUTARY_WITH_CUDA
  return true;
#else
  return false;
#endif
}

StepGraph::StepGraph(torch::Device device, int warmup) : device_(device), warmup_(warmup) {
  TRIB_CHECK(warmup >= 1, "StepGraph: warm-up runs {} (at least 1: capture needs the gradients to exist)", warmup);
  if (!device_.is_cuda()) return;
  TRIB_CHECK(available(), "train.cuda_graph: this LibTorch has no CUDA (build against a CUDA PyTorch)");
#ifdef TRIBUTARY_WITH_CUDA
  const c10::DeviceIndex index = device_.has_index() ? device_.index() : c10::cuda::current_device();
  device_ = torch::Device(torch::kCUDA, index);
  cuda_ = std::make_unique<Cuda>(index);
#endif
}

StepGraph::~StepGraph() = default;

void StepGraph::run(const std::function<void()>& stage, const std::function<void()>& body) {
  if (!device_.is_cuda()) {
    stage();
    body();
    ++runs_;
    return;
  }
#ifdef TRIBUTARY_WITH_CUDA
  const auto caller = c10::cuda::getCurrentCUDAStream(device_.index());
  {
    // The step's stream first waits for what the caller queued (an outer step's copies into the parameters, say).
    Cuda::wait(cuda_->queued, cuda_->stream, caller);
    const c10::cuda::CUDAStreamGuard guard(cuda_->stream);
    stage();
    if (runs_ < warmup_) {
      body();
    } else {
      if (!captured_) {
        torch::cuda::synchronize(device_.index());
        cuda_->graph.capture_begin();
        body();
        cuda_->graph.capture_end();
        captured_ = true;
      }
      cuda_->graph.replay();
    }
    ++runs_;
  }
  Cuda::wait(cuda_->done, caller, cuda_->stream);  // reading the step's outputs afterwards is ordered after it
#endif
}

}  // namespace tributary
