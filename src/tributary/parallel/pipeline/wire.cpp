#include "tributary/parallel/pipeline/wire.h"

#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "tributary/core/error.h"

namespace tributary::pipeline {
namespace {

int64_t rows_of(torch::IntArrayRef shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows;
}

torch::Tensor as_bytes(const torch::Tensor& t) {  // the same bytes, as uint8
  auto c = t.contiguous();
  auto out = torch::empty({c.numel() * int64_t(c.element_size())}, torch::kUInt8);
  std::memcpy(out.data_ptr(), c.data_ptr(), size_t(out.numel()));
  return out;
}

torch::Tensor from_bytes(const torch::Tensor& bytes, int64_t offset, torch::ScalarType type, torch::IntArrayRef shape) {
  auto out = torch::empty(shape, type);
  std::memcpy(out.data_ptr(), bytes.data_ptr<uint8_t>() + offset, size_t(out.numel()) * out.element_size());
  return out;
}

int64_t padded_cols(int64_t cols) { return (cols + kHadamardTile - 1) / kHadamardTile * kHadamardTile; }
int bits_of(Wire wire) { return wire == Wire::Hadamard4 ? 4 : 2; }

// The rotation: diag(signs) x H / sqrt(tile), orthonormal, so that its transpose undoes it. The signs are a fixed
// pseudo-random pattern (the same on every rank: nothing is sent for it).
const torch::Tensor& rotation() {
  static const torch::Tensor r = [] {
    const int64_t n = kHadamardTile;
    auto h = torch::ones({1, 1}, torch::kFloat64);
    while (h.size(0) < n) h = torch::cat({torch::cat({h, h}, 1), torch::cat({h, -h}, 1)}, 0);  // Sylvester
    auto signs = torch::empty({n, 1}, torch::kFloat64);
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      signs[i][0] = (state >> 63) ? -1.0 : 1.0;
    }
    return (signs * h / std::sqrt(double(n))).to(torch::kFloat32).contiguous();
  }();
  return r;
}

// x (rows, cols) -> rotated tiles (rows x tiles, kHadamardTile).
torch::Tensor rotate(const torch::Tensor& rows) {
  const int64_t cols = rows.size(1), padded = padded_cols(cols);
  auto x = padded == cols ? rows : torch::constant_pad_nd(rows, {0, padded - cols});
  return x.reshape({-1, kHadamardTile}).matmul(rotation());
}

torch::Tensor hadamard_encode(const torch::Tensor& rows, Wire wire, std::optional<uint64_t> seed) {
  const auto tiles = rotate(rows);
  const int bits = bits_of(wire);
  // Stochastic rounding (with a seed): v rounds down or up with the probabilities that make its expectation v, so the
  // rounding adds noise but no bias; the draw is the message's, the same in every run. Without: to the nearest level.
  torch::Tensor draw = torch::full({1}, 0.5f);
  if (seed) {
    auto gen = at::detail::createCPUGenerator(*seed);
    draw = at::rand(tiles.sizes(), gen, torch::kFloat32);
  }
  torch::Tensor scale, q;
  if (bits == 4) {
    scale = tiles.abs().amax(1, /*keepdim=*/true).div_(7.0).clamp_min_(1e-30);
    q = tiles.div(scale).add_(draw).floor_().clamp_(-7, 7).add_(8);  // 1..15
  } else {
    // No level is 0: an all-zero tile keeps a scale of 0 so that it decodes to zeros.
    scale = tiles.square().mean(1, /*keepdim=*/true).sqrt_().mul_(0.9957);
    q = tiles.div(scale.clamp_min(1e-30)).add_(1.5).add_(draw).floor_().clamp_(0, 3);  // levels (q - 1.5) x scale
  }
  auto codes = q.to(torch::kUInt8).reshape({-1, 8 / bits});  // 8 / bits codes per byte, lowest bits first
  auto packed = torch::zeros({codes.size(0)}, torch::kUInt8);
  for (int64_t i = 0; i < codes.size(1); ++i) packed.bitwise_or_(codes.select(1, i).bitwise_left_shift(bits * i));
  return torch::cat({packed, as_bytes(scale)});
}

torch::Tensor hadamard_decode(const torch::Tensor& buffer, Wire wire, int64_t rows, int64_t cols) {
  const int bits = bits_of(wire);
  const int64_t values = rows * padded_cols(cols), tiles = values / kHadamardTile, packed = values * bits / 8;
  auto bytes = buffer.narrow(0, 0, packed).to(torch::kInt64);
  std::vector<torch::Tensor> parts;
  for (int64_t i = 0; i < 8 / bits; ++i)
    parts.push_back(bytes.bitwise_right_shift(bits * i).bitwise_and((1 << bits) - 1));
  auto q = torch::stack(parts, 1).reshape({tiles, kHadamardTile}).to(torch::kFloat32);
  auto scale = from_bytes(buffer, packed, torch::kFloat32, {tiles, 1});
  auto level = bits == 4 ? q.sub_(8) : q.sub_(1.5);
  auto x = level.mul_(scale).matmul(rotation().t()).reshape({rows, -1});
  return x.size(1) == cols ? x : x.narrow(1, 0, cols);
}

}  // namespace

Wire parse_wire(const std::string& text, const std::string& key) {
  if (text == "fp32") return Wire::Fp32;
  if (text == "fp16") return Wire::Fp16;
  if (text == "bf16") return Wire::Bf16;
  if (text == "int8") return Wire::Int8;
  if (text == "hadamard4") return Wire::Hadamard4;
  if (text == "hadamard2") return Wire::Hadamard2;
  if (text == "aq4") return Wire::Aq4;
  if (text == "aq2") return Wire::Aq2;
  fail("{} = '{}': choose fp32, fp16, bf16, int8, hadamard4, hadamard2, aq4 or aq2", key, text);
}

int64_t wire_bytes(Wire wire, int64_t rows, int64_t cols) {
  switch (wire) {
    case Wire::Fp32:
      return rows * cols * 4;
    case Wire::Fp16:
    case Wire::Bf16:
      return rows * cols * 2;
    case Wire::Int8:
      return rows * cols + rows * 4;
    case Wire::Hadamard4:
    case Wire::Hadamard2: {
      const int64_t values = rows * padded_cols(cols);
      return values * bits_of(wire) / 8 + values / kHadamardTile * 4;
    }
    case Wire::Aq4:
    case Wire::Aq2:
      break;
  }
  TRIB_CHECK(false, "(a delta format's size depends on its cache: activation_deltas.h)");
  return 0;
}

torch::Tensor wire_encode(const torch::Tensor& x, Wire wire, std::optional<uint64_t> seed) {
  torch::NoGradGuard no_grad;
  auto cpu = x.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  switch (wire) {
    case Wire::Fp32:
      return cpu;
    case Wire::Fp16:
      return as_bytes(cpu.to(torch::kHalf));
    case Wire::Bf16:
      return as_bytes(cpu.to(torch::kBFloat16));
    case Wire::Int8: {
      auto rows = cpu.reshape({-1, cpu.size(-1)});
      auto scale = rows.abs().amax(1, /*keepdim=*/true).div_(127.0).clamp_min_(1e-30);
      auto q = rows.div(scale).round_().clamp_(-127, 127).to(torch::kInt8);
      return torch::cat({as_bytes(q), as_bytes(scale)});
    }
    case Wire::Hadamard4:
    case Wire::Hadamard2:
      return hadamard_encode(cpu.reshape({-1, cpu.size(-1)}), wire, seed);
    case Wire::Aq4:
    case Wire::Aq2:
      break;
  }
  TRIB_CHECK(false, "(a delta format encodes against its cache: activation_deltas.h)");
  return cpu;
}

torch::Tensor wire_buffer(Wire wire, torch::IntArrayRef shape) {
  if (wire == Wire::Fp32) return torch::empty(shape, torch::kFloat32);
  return torch::empty({wire_bytes(wire, rows_of(shape), shape.back())}, torch::kUInt8);
}

torch::Tensor wire_decode(const torch::Tensor& buffer, Wire wire, torch::IntArrayRef shape) {
  const int64_t rows = rows_of(shape), cols = shape.back();
  TRIB_CHECK_EQ(buffer.numel() * int64_t(buffer.element_size()), wire_bytes(wire, rows, cols));
  switch (wire) {
    case Wire::Fp32:
      return buffer;
    case Wire::Fp16:
      return from_bytes(buffer, 0, torch::kHalf, shape).to(torch::kFloat32);
    case Wire::Bf16:
      return from_bytes(buffer, 0, torch::kBFloat16, shape).to(torch::kFloat32);
    case Wire::Int8: {
      auto q = from_bytes(buffer, 0, torch::kInt8, {rows, cols});
      auto scale = from_bytes(buffer, rows * cols, torch::kFloat32, {rows, 1});
      return q.to(torch::kFloat32).mul_(scale).reshape(shape);
    }
    case Wire::Hadamard4:
    case Wire::Hadamard2:
      return hadamard_decode(buffer, wire, rows, cols).reshape(shape);
    case Wire::Aq4:
    case Wire::Aq2:
      break;  // wire_bytes refused it above
  }
  return buffer;
}

torch::Tensor seal_message(const torch::Tensor& encoded, const comm::WireMac* mac, const std::string& place) {
  return mac ? mac->seal(encoded.view(torch::kUInt8).reshape({-1}), place) : encoded;  // a view: one copy, the seal's
}

int stage_message_tag(int kind, int64_t step, int64_t mb) {
  return (kind << 28) | static_cast<int>((step & 0xFFF) << 16) | static_cast<int>(mb);  // Gloo: non-negative int32
}

std::string stage_message_place(const comm::Group& pipe, int kind, int64_t step, int64_t mb, int64_t from, int64_t to) {
  return fmt::format("{}|{}|{}|{}|{}>{}", pipe.prefix(), kind, step, mb, from, to);
}

torch::Tensor message_buffer(Wire wire, torch::IntArrayRef shape, const comm::WireMac* mac) {
  auto buffer = wire_buffer(wire, shape);
  if (!mac) return buffer;
  return torch::empty({int64_t(buffer.nbytes()) + comm::WireMac::kBytes}, torch::kUInt8);
}

torch::Tensor open_message(const torch::Tensor& received, Wire wire, torch::IntArrayRef shape, const comm::WireMac* mac,
                           const std::string& place, const std::string& what) {
  if (!mac) return wire_decode(received, wire, shape);
  const auto bytes = mac->open(received, place, what);  // a view of `received`: decoded where it arrived
  return wire_decode(wire == Wire::Fp32 ? bytes.view(torch::kFloat32).view(shape) : bytes, wire, shape);
}

torch::Tensor byte_message_buffer(int64_t bytes, const comm::WireMac* mac) {
  return torch::empty({bytes + (mac ? comm::WireMac::kBytes : 0)}, torch::kUInt8);
}

torch::Tensor open_bytes(const torch::Tensor& received, const comm::WireMac* mac, const std::string& place,
                         const std::string& what) {
  return mac ? mac->open(received, place, what) : received;
}

}  // namespace tributary::pipeline
