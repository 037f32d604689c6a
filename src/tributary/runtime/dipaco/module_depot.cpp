#include "tributary/runtime/dipaco/module_depot.h"

#include <thread>

#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/runtime/dipaco/state_server.h"

namespace tributary {
namespace {

std::string module_key(int64_t round, const std::string& id) { return fmt::format("dipaco/modules/r{}/{}", round, id); }

torch::ScalarType wire_dtype(const std::string& codec) {
  if (codec == "fp32") return torch::kFloat32;
  if (codec == "fp16") return torch::kFloat16;
  if (codec == "bf16") return torch::kBFloat16;
  fail("dipaco.fetch_codec = '{}': choose fp32, fp16 or bf16 (module values, not pseudo-gradients, are fetched)",
       codec);
}

// In the module's own order (`names`; safetensors sorts by name): paths and outer optimizers pair tensors by index.
NamedTensors decode(const std::string& bytes, const std::string& origin, const std::vector<std::string>& names) {
  auto file = safetensors::File::parse(bytes, origin);
  if (file.tensors().size() != names.size())
    fail("{}: {} tensors, the module has {}", origin, file.tensors().size(), names.size());
  NamedTensors out;
  for (const auto& name : names) out.emplace_back(name, to_torch(file.at(name)).to(torch::kFloat32));
  return out;
}

}  // namespace

ModuleDepot::ModuleDepot(comm::Store store, std::string fetch_codec, std::chrono::milliseconds timeout)
    : store_(std::move(store)), codec_(std::move(fetch_codec)), timeout_(timeout) {
  wire_dtype(codec_);  // refuses an unknown codec now, not at the first round's end
}

NamedTensors ModuleDepot::publish(int64_t round, const std::string& id, const NamedTensors& values) {
  NamedTensors wire;
  for (const auto& [name, t] : values) wire.emplace_back(name, t.to(wire_dtype(codec_)));
  std::string bytes = tensors_to_safetensors(wire);
  bytes_.published += double(bytes.size());
  store_.set(module_key(round, id), bytes);
  std::vector<std::string> names;
  for (const auto& [name, t] : values) names.push_back(name);
  return decode(bytes, "module " + id, names);
}

NamedTensors ModuleDepot::fetch(int64_t round, const std::string& id, const std::vector<std::string>& names, int owner,
                                int self) {
  const auto start = Clock::now();
  const std::string key = module_key(round, id);
  store_.wait(
      {key}, timeout_,
      fmt::format("DiPaCo: waiting for module {} of round {} from its owner (group rank {})", id, round + 1, owner));
  const std::string bytes = store_.get(key);
  if (link_ && owner != self) {  // the modelled transfer from the owner, on top of the real one
    const double modelled = link_->transfer_s(owner, self, double(bytes.size()));
    const double left = modelled - seconds_since(start);
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  }
  bytes_.fetched += double(bytes.size());
  bytes_.fetch_s += seconds_since(start);
  return decode(bytes, fmt::format("module {} of round {} from the store", id, round + 1), names);
}

void ModuleDepot::forget(int64_t round, const std::string& id) { store_.remove(module_key(round, id)); }

void ModuleDepot::put(const std::string& key, const std::string& bytes) {
  bytes_.state_put += double(bytes.size());
  store_.set("dipaco/state/" + key, bytes);
}

std::optional<std::string> ModuleDepot::get(const std::string& key) {
  if (!store_.check({"dipaco/state/" + key})) return std::nullopt;
  std::string bytes = store_.get("dipaco/state/" + key);
  bytes_.state_got += double(bytes.size());
  return bytes;
}

void ModuleDepot::remove(const std::string& key) { store_.remove("dipaco/state/" + key); }

std::optional<std::string> ModuleDepot::ask(int holder, const std::string& what, std::chrono::milliseconds timeout) {
  auto bytes = ask_holder(store_, holder, what, timeout);
  if (bytes) bytes_.state_got += double(bytes->size());
  return bytes;
}

DepotBytes ModuleDepot::take_bytes() { return std::exchange(bytes_, DepotBytes{}); }

}  // namespace tributary
