// A pipeline's whole training state as one list, alike on each of its ranks: the model's parameters (each rank's
// copy of them), then every stage's AdamW moments in stage order — this rank's own optimizer's tensors for its stage,
// buffers of the same names and shapes for the other stages'. What a fault-tolerant pipeline (runtime/sync/
// pipeline_sync.h) sends a rejoining pipeline and keeps in its checkpoints: a pipeline is one member of the run, and
// its lead (stage 0) speaks for it, so the lead must hold what every stage trains.
#pragma once

#include <functional>
#include <vector>

#include "tributary/model/tensor_io.h"
#include "tributary/optim/adamw.h"
#include "tributary/parallel/pipeline/stage.h"

namespace tributary {

class PipelineState {
 public:
  // `broadcast`: root's tensors (CPU, contiguous) to every rank of the pipeline, in place (the pipeline's sealed
  // broadcast). `params` and `optimizer` are this rank's and outlive this.
  using Broadcast = std::function<void(std::vector<torch::Tensor>& tensors, int root)>;
  PipelineState(NamedTensors& params, AdamW& optimizer, const pipeline::StageLayout& layout, int64_t stage,
                int64_t blocks_per_level, bool tied_embeddings, Broadcast broadcast);

  // The parameters, then stage 0's moments, ..., then the last stage's (a tied embedding's moments in both the first
  // and the last stage's part: each of them steps its copy).
  NamedTensors& tensors() { return tensors_; }
  size_t num_params() const { return num_params_; }
  // Each stage's moments to every rank (each stage broadcasts its own): afterwards every rank's list holds them all.
  // The parameters are the caller's to make current (PipelineSync's consolidation). Collective over the pipeline.
  void gather_moments();
  // Rank 0's whole list (as a heal left it) to every rank, which takes its stage's moments into its optimizer in
  // place. Collective over the pipeline.
  void from_lead();
  // The moments of every stage once each (a tied embedding's from stage 0), for a checkpoint's optimizer file; call
  // after gather_moments().
  NamedTensors moments() const;
  // Per stage, the sum of its moments' absolute values as this rank holds them: what the two sides of a heal log,
  // so that an operator (and a test) sees the rejoined stages took what was sent.
  std::vector<double> moment_sums() const;

 private:
  void broadcast(std::vector<torch::Tensor>& tensors, int root);  // through the CPU, back into `tensors`

  Broadcast broadcast_;
  std::vector<std::pair<size_t, size_t>> stage_range_;  // per stage: its moments' [first, end) in tensors_
  NamedTensors tensors_;
  size_t num_params_ = 0;
};

}  // namespace tributary
