#include "tributary/parallel/pipeline/wire.h"

#include <cstring>

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

}  // namespace

Wire parse_wire(const std::string& text, const std::string& key) {
  if (text == "fp32") return Wire::Fp32;
  if (text == "fp16") return Wire::Fp16;
  if (text == "bf16") return Wire::Bf16;
  if (text == "int8") return Wire::Int8;
  fail("{} = '{}': choose fp32, fp16, bf16 or int8", key, text);
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
  }
  return 0;
}

torch::Tensor wire_encode(const torch::Tensor& x, Wire wire) {
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
  }
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

}  // namespace tributary::pipeline
