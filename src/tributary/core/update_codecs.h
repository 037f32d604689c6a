// What each codec of an outer update (dist.compression) can do, by name: the one list the configuration's checks
// (config/), the asynchronous update board (optim/) and the planner read, so that a codec added to comm/codec.cpp is
// described once. No LibTorch: the codecs themselves live in comm/codec.h and comm/sparse_chunks.h.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace tributary {

// Every value dist.compression takes.
inline std::vector<std::string> update_codec_names() {
  return {"fp32", "fp16", "bf16", "int8", "fp4", "terngrad", "topk", "powersgd", "sparseloco"};
}

// Codecs that keep what they did not send on the worker, to send it later: a discarded and redone round would count
// it twice, and no receiver ever sees a replica's whole update.
inline bool keeps_error_feedback(std::string_view codec) {
  return codec == "topk" || codec == "powersgd" || codec == "sparseloco";
}

// Codecs whose encoding of one replica's update decodes on its own, with no other replica in the same collective and
// no state on either side: what an update posted to the asynchronous board (optim/update_board.h) can travel as.
inline constexpr std::array<std::string_view, 5> kTravelsAlone = {"fp32", "fp16", "bf16", "int8", "fp4"};

inline bool travels_alone(std::string_view codec) {
  return std::find(kTravelsAlone.begin(), kTravelsAlone.end(), codec) != kTravelsAlone.end();
}

// kTravelsAlone for messages: "fp32, fp16, bf16, int8 or fp4".
inline std::string travels_alone_list() {
  std::string out;
  for (size_t i = 0; i < kTravelsAlone.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == kTravelsAlone.size() ? " or " : ", ") + std::string(kTravelsAlone[i]);
  return out;
}

}  // namespace tributary
