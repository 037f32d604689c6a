// SparseLoCo for path-local DiPaCo's upload (dist.compression = "sparseloco" with dipaco.path_local; issue 17): what a
// worker sends an owner is the top-k of every chunk of its modules' pseudo-gradient sums, packed
// (comm/sparse_chunks.h), and what it did not send stays with the worker as error feedback, per module, until its paths
// touch the module again:
//   e_m <- decay * e_m + sum_m     (sum_m: this round's sum over the worker's paths through module m)
//   send top-k(e_m);  e_m <- e_m - sent_m, committed only once the upload went through.
// The feedback is per module, not per message: the owner a module goes to and the modules that share a message change
// from round to round. A module the worker does not touch keeps its feedback as it is (not decayed) until it does.
// The sums are weighted (sum_p w_p delta_p) and the owner divides by this round's weights: feedback carried from an
// earlier round is divided by a later round's weight, which is the same when every path trains equal tokens.
// What the worker owns never travels and has no feedback.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tributary/comm/sparse_chunks.h"

namespace tributary {

class ModuleFeedback {
 public:
  ModuleFeedback(comm::SparseChunkOptions options, double decay);  // Error naming a bad chunk/k/bits
  const comm::SparseChunks& chunks() const { return chunks_; }

  // The payload for the modules `modules` (indices, in the order they travel) whose sums are `sums` (each module's
  // tensors): the chunks cut the modules' feedback-corrected sums concatenated in that order. Until commit() the
  // feedback is unchanged, so a failed upload can be encoded again.
  torch::Tensor encode(const std::vector<size_t>& modules, const std::vector<const std::vector<torch::Tensor>*>& sums);
  void commit();   // every payload encoded since the last commit() went out: their residuals become the feedback
  void discard();  // they did not: forget them

  // Checkpoint: this worker's feedback as "feedback.<module index>" (1-D fp32), and back (Error naming `origin` for
  // another name or a tensor of the wrong size for the module, `numel` by module index).
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state, const std::vector<int64_t>& numel,
                  const std::string& origin);
  const std::map<size_t, torch::Tensor>& feedback() const { return feedback_; }

 private:
  comm::SparseChunks chunks_;
  double decay_;
  std::map<size_t, torch::Tensor> feedback_, pending_;  // pending_: residuals of payloads not yet committed
};

}  // namespace tributary
