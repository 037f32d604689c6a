#include "tributary/model/hf_llama.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

#include <nlohmann/json.hpp>

#include "tributary/core/error.h"
#include "tributary/model/param_name.h"

namespace tributary {

void check_llama_shaped(const ModelConfig& c) {
  if (c.mlp != "swiglu")
    fail("model.mlp = {}: the Llama layout has a SwiGLU MLP only; export needs model.mlp = swiglu", c.mlp);
  if (c.positions != "rope")
    fail("model.positions = {}: the Llama layout has rotary positions only; export needs model.positions = rope",
         c.positions);
}

std::string hf_llama_config_json(const ModelConfig& c) {
  check_llama_shaped(c);
  // q/k/v biases without an output bias are Qwen 2's attention; everything else here is Llama's.
  const bool qwen2 = c.qkv_bias;
  nlohmann::json j = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
                      {"model_type", qwen2 ? "qwen2" : "llama"},
                      {"hidden_size", c.width},
                      {"intermediate_size", c.resolved_mlp_hidden()},
                      {"num_attention_heads", c.num_heads},
                      {"num_key_value_heads", c.kv_heads()},
                      {"num_hidden_layers", c.num_layers},
                      {"rms_norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"vocab_size", c.vocab_size},
                      {"max_position_embeddings", c.context},
                      {"tie_word_embeddings", c.tie_embeddings},
                      {"hidden_act", "silu"},
                      {"torch_dtype", "float32"}};
  if (!qwen2) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  if (c.fixed_head_dim > 0) j["head_dim"] = c.fixed_head_dim;
  if (c.rope_scaling != "none") {
    nlohmann::json scaling = {{"rope_type", c.rope_scaling}, {"factor", c.rope_factor}};
    if (c.rope_scaling == "llama3") {
      scaling["low_freq_factor"] = c.rope_low_freq_factor;
      scaling["high_freq_factor"] = c.rope_high_freq_factor;
      scaling["original_max_position_embeddings"] = c.rope_original_context;
    }
    j["rope_scaling"] = scaling;  // the published configs' key, which transformers 4 and 5 both read
  }
  return j.dump(2) + "\n";
}

namespace {

// The Hugging Face tensors one of our parameters is made of, in row order, with their rows: our fused projections
// are row blocks of theirs (attn.qkv = [q; k; v], mlp.fc = [gate; up]).
std::vector<std::pair<std::string, int64_t>> hf_pieces(const std::string& name, const ModelConfig& c, int64_t rows) {
  const auto place = parse_param_name(name);
  TRIB_CHECK(place.has_value(), "parameter '{}' has no place in the model", name);
  if (place->part != ParamPlace::Part::Block) {
    const char* hf = name == "embed_tok.weight"    ? "model.embed_tokens.weight"
                     : name == "final_norm.weight" ? "model.norm.weight"
                     : name == "head.weight"       ? "lm_head.weight"
                                                   : nullptr;
    if (!hf) fail("parameter '{}' has no Llama counterpart", name);
    return {{hf, rows}};
  }
  const int64_t Q = c.num_heads * c.head_dim(), F = c.resolved_mlp_hidden(), KV = c.kv_heads() * c.head_dim();
  const std::string layer = fmt::format("model.layers.{}.", place->model_block(c.blocks_per_level()));
  const std::string& r = place->rest;
  if (r == "attn_norm.weight") return {{layer + "input_layernorm.weight", rows}};
  if (r == "attn.qkv.weight")
    return {{layer + "self_attn.q_proj.weight", Q},
            {layer + "self_attn.k_proj.weight", KV},
            {layer + "self_attn.v_proj.weight", KV}};
  if (r == "attn.qkv.bias")
    return {{layer + "self_attn.q_proj.bias", Q},
            {layer + "self_attn.k_proj.bias", KV},
            {layer + "self_attn.v_proj.bias", KV}};
  if (r == "attn.proj.weight") return {{layer + "self_attn.o_proj.weight", rows}};
  if (r == "mlp_norm.weight") return {{layer + "post_attention_layernorm.weight", rows}};
  if (r == "mlp.fc.weight")  // swiglu(h) = silu(h[:F]) * h[F:]
    return {{layer + "mlp.gate_proj.weight", F}, {layer + "mlp.up_proj.weight", F}};
  if (r == "mlp.proj.weight") return {{layer + "mlp.down_proj.weight", rows}};
  fail("parameter '{}' has no Llama counterpart", name);
}

}  // namespace

NamedTensors to_hf_llama(const Transformer& model) {
  const ModelConfig& c = model.config();
  check_llama_shaped(c);
  NamedTensors out;
  for (const auto& [name, t] : named_parameters_of(model)) {
    const torch::Tensor w = t.detach().to(torch::kCPU).contiguous();
    int64_t row = 0;
    const auto pieces = hf_pieces(name, c, w.size(0));
    for (const auto& [hf, rows] : pieces) {
      out.emplace_back(hf, pieces.size() == 1 ? w : w.narrow(0, row, rows).clone());
      row += rows;
    }
  }
  return out;
}

NamedTensors from_hf_llama(const Transformer& model, const std::map<std::string, torch::Tensor>& hf,
                           const std::string& origin) {
  const ModelConfig& c = model.config();
  NamedTensors out;
  std::set<std::string> used;
  for (const auto& [name, t] : named_parameters_of(model)) {
    std::vector<torch::Tensor> parts;
    for (const auto& [hf_name, rows] : hf_pieces(name, c, t.size(0))) {
      const auto it = hf.find(hf_name);
      if (it == hf.end())
        fail("{}: tensor '{}' is missing (the config describes {} layers)", origin, hf_name, c.num_layers);
      std::vector<int64_t> want = t.sizes().vec();
      want[0] = rows;
      if (it->second.sizes().vec() != want)
        fail("{}: tensor '{}' has shape {} where the config.json implies {}", origin, hf_name,
             fmt::format("{}", fmt::join(it->second.sizes().vec(), "x")), fmt::format("{}", fmt::join(want, "x")));
      parts.push_back(it->second.to(torch::kFloat32));
      used.insert(hf_name);
    }
    out.emplace_back(name, parts.size() == 1 ? parts[0].contiguous() : torch::cat(parts, 0));
  }
  for (const auto& [hf_name, t] : hf)
    if (!used.count(hf_name) && hf_name.find("rotary_emb.inv_freq") == std::string::npos)  // recomputed, not learned
      fail("{}: tensor '{}' has no place in a Llama model of this config (biases, other architectures: not supported)",
           origin, hf_name);
  return out;
}

ModelConfig llama_model_config(const std::string& json_text, const std::string& origin) {
  const auto j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", origin);
  // Optional keys of a JSON type other than the one transformers writes are named, not a crash.
  auto text = [&](const char* key, const std::string& otherwise) {
    if (!j.contains(key) || j[key].is_null()) return otherwise;
    if (!j[key].is_string()) fail("{}: '{}' = {} must be a string", origin, key, j[key].dump());
    return j[key].get<std::string>();
  };
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) fail("{}: '{}' = {} must be true or false", origin, key, j[key].dump());
    return j[key].get<bool>();
  };
  // A base or an epsilon of `in` (the config, or one of its objects named `where`): finite and above 0.
  auto positive = [&](const nlohmann::json& in, const char* key, double otherwise, const std::string& where = "") {
    if (!in.contains(key) || in[key].is_null()) return otherwise;
    if (!in[key].is_number() || !(in[key].get<double>() > 0) || !std::isfinite(in[key].get<double>()))
      fail("{}: '{}{}' = {} must be a positive finite number", origin, where, key, in[key].dump());
    return in[key].get<double>();
  };
  // Mistral and Qwen 2 are Llama's computation under Llama's tensor names: Mistral with a sliding window that a
  // context within it never reaches, Qwen 2 with biases on q, k and v.
  const auto archs = j.contains("architectures") ? j["architectures"] : nlohmann::json::array();
  const std::string model_type = text("model_type", "llama");
  const std::map<std::string, std::string> architecture_of = {
      {"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"}};
  const auto known = architecture_of.find(model_type);
  if (known == architecture_of.end() || (archs.is_array() && !archs.empty() && archs[0] != known->second))
    fail(
        "{}: 'architectures' / 'model_type' say {} / {}: only LlamaForCausalLM, MistralForCausalLM and "
        "Qwen2ForCausalLM (model_type llama, mistral, qwen2) can be imported",
        origin, archs.dump(), model_type);
  // Bounded as the same keys of a run configuration are (config/run_config.cpp): what this tool can build.
  auto integer = [&](const char* key, int64_t most) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
      fail("{}: '{}' must be a positive integer", origin, key);
    if (j[key].get<int64_t>() > most)
      fail("{}: '{}' = {} is more than this tool builds ({})", origin, key, j[key].get<int64_t>(), most);
    return j[key].get<int64_t>();
  };
  ModelConfig c;
  c.width = integer("hidden_size", 1 << 16);
  c.num_layers = integer("num_hidden_layers", 1024);
  c.num_heads = integer("num_attention_heads", 1024);
  c.mlp_hidden = integer("intermediate_size", 1 << 20);
  c.vocab_size = integer("vocab_size", 1 << 24);
  c.context = integer("max_position_embeddings", 1 << 20);
  c.num_levels = 1;
  c.mlp = "swiglu";
  c.positions = "rope";
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    const int64_t kv = integer("num_key_value_heads", 1024);
    if (c.num_heads % kv != 0)
      fail(
          "{}: num_key_value_heads = {} does not divide num_attention_heads = {}: grouped-query attention needs "
          "the same number of query heads per key/value head",
          origin, kv, c.num_heads);
    if (kv != c.num_heads) c.num_kv_heads = kv;  // equal: plain multi-head attention, our default (0)
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    const int64_t head_dim = integer("head_dim", 1 << 12);
    if (c.width % c.num_heads != 0 || head_dim != c.width / c.num_heads) c.fixed_head_dim = head_dim;
  }
  if (model_type == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    // Within the window Mistral's attention is plain causal attention: the context is kept within it.
    c.context = std::min(c.context, integer("sliding_window", 1 << 20));
  }
  if (model_type == "qwen2") {
    if (flag("use_sliding_window"))
      fail("{}: use_sliding_window = true: sliding-window attention is not supported", origin);
    c.qkv_bias = true;
  }
  if (const std::string act = text("hidden_act", "silu"); act != "silu")
    fail("{}: hidden_act = {}: only silu (SwiGLU) is supported", origin, j["hidden_act"].dump());
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (flag(key))
      fail("{}: {} = true: biases on every projection are not supported (Qwen 2's on q, k, v are)", origin, key);
  c.rope_theta = positive(j, "rope_theta", 10000.0);
  // RoPE's settings: transformers >= 5 writes one object, {"rope_type": "default", "rope_theta": ...}; published
  // configs have rope_theta and, when scaled, rope_scaling {"rope_type" (or "type"): "llama3" | "linear", ...}.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const auto& rope = j[key];
    const std::string where = std::string(key) + ".";
    if (!rope.is_object()) fail("{}: {} = {} must be an object", origin, key, rope.dump());
    const auto type_field = rope.contains("rope_type") ? rope["rope_type"] : rope.value("type", nlohmann::json());
    const std::string type = type_field.is_string() ? type_field.get<std::string>() : "default";
    c.rope_theta = positive(rope, "rope_theta", c.rope_theta, where);
    if (type == "default") continue;
    if (type != "llama3" && type != "linear")
      fail("{}: {} = {}: RoPE of type '{}' is not supported (default, linear, llama3)", origin, key, rope.dump(), type);
    c.rope_scaling = type;
    c.rope_factor = positive(rope, "factor", 1.0, where);
    if (type == "llama3") {
      c.rope_low_freq_factor = positive(rope, "low_freq_factor", 1.0, where);
      c.rope_high_freq_factor = positive(rope, "high_freq_factor", 4.0, where);
      c.rope_original_context = int64_t(positive(rope, "original_max_position_embeddings", 8192, where));
    }
  }
  c.norm_eps = positive(j, "rms_norm_eps", 1e-6);
  // The ranges of model.rope_theta and model.norm_eps (config/run_config.cpp): an import that a later load would
  // refuse is refused here, naming the file.
  auto within = [&](const char* key, double value, double lo, double hi) {
    if (value < lo || value > hi)
      fail("{}: '{}' = {} is outside [{}, {}], what the model's configuration allows", origin, key, value, lo, hi);
  };
  within("rope_theta", c.rope_theta, 1.0, 1e9);
  within("rms_norm_eps", c.norm_eps, 0.0, 1.0);
  c.tie_embeddings = flag("tie_word_embeddings");
  return c;
}

}  // namespace tributary
