#include "tributary/optim/update_board.h"

#include <fmt/format.h>

#include <thread>

#include "tributary/comm/codec.h"
#include "tributary/core/clock.h"
#include "tributary/core/error.h"
#include "tributary/core/safetensors.h"
#include "tributary/core/update_codecs.h"

namespace tributary {
namespace {

const std::string& P = UpdateBoard::kPrefix;

std::string update_key(int replica, int64_t n) { return fmt::format("{}up/{}/{}", P, replica, n); }
std::string count_key(int replica) { return fmt::format("{}up/{}/count", P, replica); }
std::string commit_key(int64_t v) { return fmt::format("{}commit/{}", P, v); }
std::string params_key(int64_t v, int merger) { return fmt::format("{}g/{}/{}", P, v, merger); }
std::string momenta_key(int64_t v, int merger) { return fmt::format("{}m/{}/{}", P, v, merger); }
std::string step_key(int64_t v, int merger) { return fmt::format("{}s/{}/{}", P, v, merger); }
std::string term_key(int64_t t) { return fmt::format("{}merger/{}", P, t); }

// fp4's packer (comm/codec.h), stateless: one for every tensor and thread.
const comm::Codec* fp4() {
  static const std::unique_ptr<comm::Codec> packer = comm::make_codec("fp4");
  return packer.get();
}

// int8: one symmetric scale per tensor (absmax / 127), sent beside it as "<name>.scale". fp4: comm::Codec's bytes
// (E3M0, a scale per tensor) as a byte tensor, with the tensor's shape beside it as "<name>.shape".
NamedTensors encode(const NamedTensors& delta, const std::string& codec) {
  NamedTensors wire;
  for (const auto& [name, t] : delta) {
    const torch::Tensor x = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    if (codec == "fp32") {
      wire.emplace_back(name, x);
    } else if (codec == "fp16") {
      wire.emplace_back(name, x.to(torch::kFloat16));
    } else if (codec == "bf16") {
      wire.emplace_back(name, x.to(torch::kBFloat16));
    } else if (codec == "fp4") {
      const comm::Codec* packer = fp4();
      torch::Tensor bytes = torch::empty({static_cast<int64_t>(packer->encoded_bytes(x.numel()))}, torch::kUInt8);
      packer->encode(x.view({-1}), bytes.data_ptr<uint8_t>());
      wire.emplace_back(name, bytes);
      wire.emplace_back(name + ".shape", torch::tensor(x.sizes().vec(), torch::kInt64));
    } else {
      const float absmax = x.abs().max().item<float>();
      const float scale = absmax > 0 && std::isfinite(absmax) ? absmax / 127.0f : 1.0f;
      // a non-finite value stays visible to the merger's check instead of being clamped into range
      const torch::Tensor q = std::isfinite(absmax) ? (x / scale).round().clamp(-127, 127).to(torch::kInt8)
                                                    : torch::full_like(x, 127).to(torch::kInt8);
      wire.emplace_back(name, q);
      wire.emplace_back(name + ".scale",
                        std::isfinite(absmax) ? torch::full({1}, scale) : torch::full({1}, std::nanf("")));
    }
  }
  return wire;
}

bool ends_with(const std::string& name, const std::string& tail) {
  return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// What travels beside a tensor (its int8 scale, its fp4 shape), not a tensor of the model.
bool is_side(const std::string& name) { return ends_with(name, ".scale") || ends_with(name, ".shape"); }

// A packed tensor's values: its shape must be whole and its bytes exactly what the codec writes for that many values
// (a blob another participant wrote is refused with an Error, never read past its end).
torch::Tensor unpacked(const safetensors::File& file, const std::string& name, const std::string& codec) {
  const torch::Tensor shape = to_torch(file.at(name + ".shape")).to(torch::kInt64).contiguous();
  const torch::Tensor bytes = to_torch(file.at(name)).contiguous();
  if (codec != "fp4" || bytes.scalar_type() != torch::kUInt8 || bytes.dim() != 1 || shape.dim() != 1 ||
      shape.numel() > 8)
    fail("tensor '{}' is not an fp4 tensor of dist.compression = '{}'", name, codec);
  std::vector<int64_t> dims;
  int64_t numel = 1;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const int64_t d = shape[i].item<int64_t>();
    if (d < 0 || d > (int64_t{1} << 40) || (d > 0 && numel > (int64_t{1} << 40) / d))
      fail("tensor '{}': shape dimension {} is {}", name, i, d);
    dims.push_back(d);
    numel *= d;
  }
  const comm::Codec* packer = fp4();
  if (static_cast<size_t>(bytes.numel()) != packer->encoded_bytes(numel))
    fail("tensor '{}': {} bytes for {} fp4 values (expected {})", name, bytes.numel(), numel,
         packer->encoded_bytes(numel));
  return packer->decode(bytes.data_ptr<uint8_t>(), numel).view(dims);
}

torch::Tensor decoded(const safetensors::File& file, const std::string& name, const std::string& codec) {
  if (file.contains(name + ".shape")) return unpacked(file, name, codec);
  torch::Tensor t = to_torch(file.at(name)).to(torch::kFloat32);
  if (file.contains(name + ".scale")) t.mul_(to_torch(file.at(name + ".scale")).to(torch::kFloat32));
  return t;
}

// In the model's order (`names`; safetensors sorts by name), so that callers pair tensors by index; an Error naming
// what is missing or extra.
NamedTensors decode(const safetensors::File& file, const std::vector<std::string>& names, const std::string& codec) {
  size_t held = 0;
  for (const auto& [name, view] : file.tensors()) held += !is_side(name);
  if (held != names.size()) fail("it holds {} tensors, the model has {}", held, names.size());
  NamedTensors out;
  for (const auto& name : names) {
    if (!file.contains(name)) fail("it has no tensor '{}'", name);
    out.emplace_back(name, decoded(file, name, codec));
  }
  return out;
}

// Every tensor, in the file's order (the momenta, which OuterOptimizer::load_state reads by name).
NamedTensors decode_all(const safetensors::File& file, const std::string& codec) {
  NamedTensors out;
  for (const auto& [name, view] : file.tensors())
    if (!is_side(name)) out.emplace_back(name, decoded(file, name, codec));
  return out;
}

}  // namespace

UpdateBoard::UpdateBoard(comm::Store store, std::string codec, std::optional<comm::LinkModel> link, int self,
                         std::shared_ptr<comm::MessageSigner> signer)
    : store_(std::move(store)),
      codec_(std::move(codec)),
      link_(std::move(link)),
      self_(self),
      signer_(std::move(signer)) {
  if (!travels_alone(codec_))
    fail(
        "dist.compression = '{}' with dist.algorithm = async_diloco: a replica's update travels on its own to the "
        "merger, so only {} apply (the ring and sparse codecs need every replica in one collective)",
        codec_, travels_alone_list());
}

void UpdateBoard::wait_link(int from, int to, size_t bytes, double already_s) const {
  if (!link_ || from < 0 || to < 0 || from == to || from >= link_->num_ranks || to >= link_->num_ranks) return;
  const double left = link_->transfer_s(from, to, double(bytes)) - already_s;
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

void UpdateBoard::put(const std::string& key, const std::string& bytes) {
  store_.set(key, comm::signed_text(signer_.get(), key, bytes));
}

std::optional<std::string> UpdateBoard::take(const std::string& key, int author) {
  return comm::read_signed(store_, signer_.get(), key, {author});
}

int64_t UpdateBoard::post(const NamedTensors& delta, int64_t base_version, int64_t tokens, int merger) {
  const auto start = Clock::now();
  const int64_t n = store_.add(count_key(self_), 0);
  const std::string bytes = tensors_to_safetensors(
      encode(delta, codec_),
      {{"base", std::to_string(base_version)}, {"tokens", std::to_string(tokens)}, {"replica", std::to_string(self_)}});
  put(update_key(self_, n), bytes);
  wait_link(self_, merger, bytes.size(), seconds_since(start));
  store_.add(count_key(self_), 1);  // the post is readable once counted
  bytes_posted_ += double(bytes.size());
  return n;
}

namespace {

// A term is claimed by the replica it names.
bool claimed_by_itself(const std::string& value, int author) {
  if (author >= 0) return value == std::to_string(author);
  return !value.empty() && value.find_first_not_of("0123456789") == std::string::npos && value.size() < 9;
}

}  // namespace

std::optional<int> UpdateBoard::term_holder(int64_t term) {
  const auto claim = comm::agreed_value(store_, signer_.get(), term_key(term), {}, claimed_by_itself);
  if (!claim) return std::nullopt;
  return std::stoi(claim->value);
}

int UpdateBoard::claim_term(int64_t term) {
  return std::stoi(
      comm::propose_value(store_, signer_.get(), term_key(term), std::to_string(self_), {}, claimed_by_itself).value);
}

int UpdateBoard::merger_now() {
  std::optional<int> holder;
  while (const auto next = term_holder(term_ + 1)) {
    holder = next;
    ++term_;
  }
  if (term_ < 0) return -1;
  if (!holder) holder = term_holder(term_);
  return holder.value_or(-1);
}

int64_t UpdateBoard::posted(int replica) { return store_.add(count_key(replica), 0); }

PostedUpdate UpdateBoard::read(int replica, int64_t number, const std::vector<std::string>& names) {
  PostedUpdate u{.replica = replica, .number = number};
  const std::string key = update_key(replica, number);
  std::optional<std::string> bytes = take(key, replica);
  if (!bytes) {  // why: asked of the store only for a post not taken
    u.error = !store_.check({key})
                  ? std::string("its bytes are gone from the store")
                  : fmt::format("it does not carry replica {}'s signature (another participant wrote it in its name)",
                                replica);
    return u;
  }
  try {
    const auto file = safetensors::File::parse(std::move(*bytes), key);
    const auto& meta = file.metadata();
    auto number_of = [&](const std::string& what) -> int64_t {
      const auto it = meta.find(what);
      if (it == meta.end()) fail("no '{}' in its metadata", what);
      size_t used = 0;
      const int64_t v = std::stoll(it->second, &used);
      if (used != it->second.size()) fail("'{}' = '{}' is not a number", what, it->second);
      return v;
    };
    u.base_version = number_of("base");
    u.tokens = number_of("tokens");
    if (number_of("replica") != replica) fail("it says it is replica {}'s", number_of("replica"));
    u.delta = decode(file, names, codec_);
  } catch (const std::exception& e) {  // a malformed post is refused, never thrown at the merger
    u.delta.clear();
    u.error = std::string("its bytes do not parse: ") + e.what();
  }
  return u;
}

void UpdateBoard::forget(int replica, int64_t number) { store_.remove(update_key(replica, number)); }

int64_t UpdateBoard::latest() { return store_.add(P + "version", 0); }

namespace {

// A version is committed by the merger its commit names.
bool committed_by_its_merger(const std::string& value, int author) {
  try {  // a value that is no commit is skipped like a forged one
    const auto meta = nlohmann::json::parse(value);
    return meta.is_object() && (author < 0 || meta.value("merger", -2) == author);
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::optional<CommittedVersion> UpdateBoard::commit_of(int64_t version) {
  if (version <= 0) return std::nullopt;
  const auto commit = comm::agreed_value(store_, signer_.get(), commit_key(version), {}, committed_by_its_merger);
  if (!commit) return std::nullopt;
  return CommittedVersion{version, nlohmann::json::parse(commit->value)};
}

NamedTensors UpdateBoard::as_received(const NamedTensors& tensors) const {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return decode(safetensors::File::parse(tensors_to_safetensors(encode(tensors, codec_)), "a step"), names, codec_);
}

bool UpdateBoard::publish(int64_t version, int merger, const NamedTensors& params, const NamedTensors& momenta,
                          const NamedTensors& step, nlohmann::json meta) {
  put(params_key(version, merger), tensors_to_safetensors(params));
  put(momenta_key(version, merger), tensors_to_safetensors(momenta));
  if (!step.empty()) put(step_key(version, merger), tensors_to_safetensors(encode(step, codec_)));
  meta["merger"] = merger;
  const std::string mine = meta.dump();
  if (comm::propose_value(store_, signer_.get(), commit_key(version), mine, {}, committed_by_its_merger).value !=
      mine) {
    store_.remove(params_key(version, merger));
    store_.remove(momenta_key(version, merger));
    store_.remove(step_key(version, merger));
    return false;
  }
  store_.add(P + "version", 1);
  return true;
}

NamedTensors UpdateBoard::fetch_params(const CommittedVersion& version, const std::vector<std::string>& names) {
  const auto start = Clock::now();
  const int merger = version.meta.at("merger").get<int>();
  const std::string key = params_key(version.version, merger);
  auto bytes = take(key, merger);
  if (!bytes) return {};  // three versions behind by now: deleted (or refused)
  wait_link(merger, self_, bytes->size(), seconds_since(start));
  bytes_fetched_ += double(bytes->size());
  return decode(safetensors::File::parse(std::move(*bytes), key), names, codec_);
}

NamedTensors UpdateBoard::fetch_momenta(const CommittedVersion& version) {
  const int merger = version.meta.at("merger").get<int>();
  const std::string key = momenta_key(version.version, merger);
  auto bytes = take(key, merger);
  if (!bytes) return {};
  return decode_all(safetensors::File::parse(std::move(*bytes), key), codec_);
}

NamedTensors UpdateBoard::fetch_step(const CommittedVersion& version, const std::vector<std::string>& names) {
  const auto start = Clock::now();
  const int merger = version.meta.at("merger").get<int>();
  const std::string key = step_key(version.version, merger);
  auto bytes = take(key, merger);
  if (!bytes) return {};
  wait_link(merger, self_, bytes->size(), seconds_since(start));
  bytes_fetched_ += double(bytes->size());
  return decode(safetensors::File::parse(std::move(*bytes), key), names, codec_);
}

void UpdateBoard::forget_version(const CommittedVersion& version) {
  const int merger = version.meta.at("merger").get<int>();
  store_.remove(params_key(version.version, merger));
  store_.remove(momenta_key(version.version, merger));
  store_.remove(step_key(version.version, merger));
}

}  // namespace tributary
