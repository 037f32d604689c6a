// Discriminative routing (DiPaCo §2.3): after a DiPaCo run, every path scores every unit of a small router split
// (held out of the new training shards); the label of a unit is the path with the lowest loss on its tokens after
// the 32-token prefix; a P-class logistic regression on the standardised features learns to predict it, and a bias
// (adjusted after training) keeps every path's share of the training units near 1/P. The new router re-shards the
// training and validation units; train DiPaCo again on the new routes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tributary/core/fs.h"

namespace tributary {

struct DiscriminativeOptions {
  std::string run;  // a DiPaCo run directory (its routes give the feature model and source dataset)
  fs::path out;
  bool overwrite = false;
  int64_t overlap = 1;
  int64_t router_permille = 20;  // training units per thousand in the router split
  int64_t epochs = 300;          // full-batch Adam iterations of the logistic regression
  uint64_t seed = 0;
  std::string device = "cpu";
};

nlohmann::json build_discriminative_routes(const DiscriminativeOptions& options);

}  // namespace tributary
