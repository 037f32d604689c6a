// What a pipeline message carries on the wire (parallel.activation_compression): activations and activation
// gradients as fp32 (exact), fp16 or bf16 (cast), int8 with one fp32 scale per token row (absmax / 127, the 8-bit
// activation compression SWARM and DT-FM's successors use): C + 4 bytes per token instead of 4 C; or at 4 or 2 bits
// after a tile-wise Hadamard rotation (hadamard4, hadamard2; the idea of TAH-Quant, without its adaptive bit widths):
// each token row is cut into tiles of kHadamardTile values (the last padded with zeros), each tile is multiplied by a
// fixed random sign pattern and the orthonormal Hadamard matrix — which spreads an outlier channel's energy over the
// whole tile, so that few levels suffice — and quantized with one fp32 scale per tile: 4 bits symmetric (absmax / 7,
// levels -7..7), or 2 bits on four levels (-1.5, -0.5, 0.5, 1.5) x 0.9957 x the tile's RMS (the uniform quantizer of
// least squared error for Gaussian values, which rotated tiles resemble). C / 2 + 4
// C / 64 bytes per token (hadamard4, 7.1x fewer than fp32) or C / 4 + 4 C / 64 (hadamard2, 12.8x). The receiver decodes
// to fp32 (the inverse rotation) before its blocks run; the loss of precision is the only change (no error feedback, no
// cache: every message is encoded alone).
// aq4 and aq2 are AQ-SGD's (Wang et al., NeurIPS 2022) for runs that revisit examples: an activation travels as its
// change since the example last crossed the same boundary, at 4 or 2 bits (the Hadamard formats), against a cache
// both neighbours keep (activation_deltas.h); activation gradients travel as hadamard4.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "tributary/comm/group.h"
#include "tributary/comm/wire_mac.h"

namespace tributary::pipeline {

enum class Wire { Fp32, Fp16, Bf16, Int8, Hadamard4, Hadamard2, Aq4, Aq2 };

// AQ-SGD's formats: activations as deltas against a cache (activation_deltas.h), which wire_bytes / wire_encode do
// not handle; delta_wire() is what a delta travels as, gradient_wire() what the activation gradients travel as.
inline bool is_delta(Wire wire) { return wire == Wire::Aq4 || wire == Wire::Aq2; }
inline Wire delta_wire(Wire wire) { return wire == Wire::Aq2 ? Wire::Hadamard2 : Wire::Hadamard4; }
inline Wire gradient_wire(Wire wire) { return is_delta(wire) ? Wire::Hadamard4 : wire; }

inline constexpr int64_t kHadamardTile = 64;  // values per rotated tile (a power of two)

Wire parse_wire(const std::string& text, const std::string& key);  // an Error naming `key` for anything else

// Bytes of one message of `rows` token rows of width `cols` (not for the delta formats).
int64_t wire_bytes(Wire wire, int64_t rows, int64_t cols);

// A contiguous CPU tensor to send: fp32 as is (float), otherwise wire_bytes(...) bytes (uint8). `seed`: the Hadamard
// formats round stochastically, drawing from it (each message its own: the same in every run); without one, to the
// nearest level. The pipeline rounds gradients stochastically (unbiased) and activations to the nearest (stochastic
// activations measured worse: docs/benchmarks.md §43).
torch::Tensor wire_encode(const torch::Tensor& x, Wire wire, std::optional<uint64_t> seed = std::nullopt);
// A receive buffer for a message of `shape` (rows = all but the last dimension).
torch::Tensor wire_buffer(Wire wire, torch::IntArrayRef shape);
// The fp32 tensor of `shape` a received buffer holds.
torch::Tensor wire_decode(const torch::Tensor& buffer, Wire wire, torch::IntArrayRef shape);

// With the run's key (`mac`; null: none) every message between stages carries a MAC bound to `place` (the pipeline,
// the kind, step and micro-batch, sender and receiver; comm/wire_mac.h): seal_message() makes what goes on the wire
// from wire_encode's tensor, message_buffer() what a message of `shape` arrives in, and open_message() checks it
// (NetworkError naming `what` when the tag is not the run's: nothing of it is used) and decodes it as wire_decode.
torch::Tensor seal_message(const torch::Tensor& encoded, const comm::WireMac* mac, const std::string& place);
// A message between two neighbouring stages of `pipe` (pipelines' and local stages' alike): its Gloo tag, unique per
// (peer, message) within a step and across neighbouring steps, and its place, which its MAC is bound to.
int stage_message_tag(int kind, int64_t step, int64_t mb);
std::string stage_message_place(const comm::Group& pipe, int kind, int64_t step, int64_t mb, int64_t from, int64_t to);
torch::Tensor message_buffer(Wire wire, torch::IntArrayRef shape, const comm::WireMac* mac);
torch::Tensor open_message(const torch::Tensor& received, Wire wire, torch::IntArrayRef shape, const comm::WireMac* mac,
                           const std::string& place, const std::string& what);
// The same for a message whose size and decoding its receiver works out itself (the delta formats): a buffer of
// `bytes` (+ the MAC), and the received bytes once the MAC is checked.
torch::Tensor byte_message_buffer(int64_t bytes, const comm::WireMac* mac);
torch::Tensor open_bytes(const torch::Tensor& received, const comm::WireMac* mac, const std::string& place,
                         const std::string& what);

}  // namespace tributary::pipeline
