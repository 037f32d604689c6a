#include "tributary/artifacts/inference.h"

#include "tributary/artifacts/checkpoint.h"
#include "tributary/core/error.h"

namespace tributary {

EvalResult evaluate(Transformer& model, BatchLoader& loader, int64_t num_batches, const torch::Device& device,
                    Progress* progress) {
  torch::NoGradGuard no_grad;
  const int64_t B = loader.batch_size(), T = loader.context();
  auto batch = torch::empty({B, T + 1}, torch::kInt64);  // (B, T+1) on the host
  double total = 0;
  for (int64_t i = 0; i < num_batches; ++i) {
    loader.next(batch.data_ptr<int64_t>());
    auto on_device = batch.to(device);
    auto loss = Transformer::loss(model.forward(on_device.narrow(1, 0, T)), on_device.narrow(1, 1, T));
    total += loss.item<double>();
    if (progress) progress->advance();
  }
  return {total / double(num_batches), num_batches * B * T};
}

torch::Device parse_device(const std::string& spec) {
  std::optional<torch::Device> device;
  try {
    device = torch::Device(spec);
  } catch (const std::exception&) {
    fail("train.device = '{}' is not a device (use cpu, cuda or cuda:N)", spec);
  }
  if (device->is_cuda() && !torch::cuda::is_available())
    fail("train.device = '{}' but this LibTorch build has no usable CUDA device; use --set train.device=cpu", spec);
  return *device;
}

LoadedModel load_model(const std::string& path, const torch::Device& device) {
  auto ckpt = load_checkpoint(path);
  LoadedModel out{RunConfig::from_toml(ckpt.config_toml, (ckpt.dir / "config.toml").string()), nullptr, nullptr,
                  ckpt.state.value("step", int64_t{0}), ckpt.dir};
  out.model = std::make_shared<Transformer>(out.config.model);
  load_parameters(*out.model, ckpt.model);
  out.model->to(device);
  const std::string kind = ckpt.state.value("tokenizer", "byte");
  std::optional<int32_t> eot;
  if (ckpt.state.contains("eot_id") && ckpt.state["eot_id"].is_number_integer())
    eot = ckpt.state["eot_id"].get<int32_t>();
  out.tokenizer = open_tokenizer(ckpt.dir, kind, eot);
  if (out.tokenizer->vocab_size() > out.config.model.vocab_size)
    fail("checkpoint '{}': tokenizer has {} ids but the model only {}", ckpt.dir.string(), out.tokenizer->vocab_size(),
         out.config.model.vocab_size);
  return out;
}

}  // namespace tributary
