#include "tributary/model/hf_llama.h"

#include <fmt/format.h>

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
  const nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
      {"hidden_size", c.width}, {"intermediate_size", c.resolved_mlp_hidden()},
      {"num_attention_heads", c.num_heads}, {"num_key_value_heads", c.num_heads},
      {"num_hidden_layers", c.num_layers}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
      {"vocab_size", c.vocab_size}, {"max_position_embeddings", c.context},
      {"tie_word_embeddings", c.tie_embeddings}, {"hidden_act", "silu"}, {"attention_bias", false},
      {"mlp_bias", false}, {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

NamedTensors to_hf_llama(const Transformer& model) {
  const ModelConfig& c = model.config();
  check_llama_shaped(c);
  const int64_t C = c.width, F = c.resolved_mlp_hidden();
  NamedTensors out;
  for (const auto& [name, t] : named_parameters_of(model)) {
    const torch::Tensor w = t.detach().to(torch::kCPU).contiguous();
    const auto place = parse_param_name(name);
    TRIB_CHECK(place.has_value(), "parameter '{}' has no place in the model", name);
    if (place->part != ParamPlace::Part::Block) {
      const char* hf = name == "embed_tok.weight" ? "model.embed_tokens.weight"
                       : name == "final_norm.weight" ? "model.norm.weight"
                       : name == "head.weight"       ? "lm_head.weight"
                                                     : nullptr;
      TRIB_CHECK(hf, "parameter '{}' has no Llama counterpart", name);
      out.emplace_back(hf, w);
      continue;
    }
    const std::string layer = fmt::format("model.layers.{}.", place->model_block(c.blocks_per_level()));
    const std::string& r = place->rest;
    if (r == "attn_norm.weight") {
      out.emplace_back(layer + "input_layernorm.weight", w);
    } else if (r == "attn.qkv.weight") {
      out.emplace_back(layer + "self_attn.q_proj.weight", w.narrow(0, 0, C).clone());
      out.emplace_back(layer + "self_attn.k_proj.weight", w.narrow(0, C, C).clone());
      out.emplace_back(layer + "self_attn.v_proj.weight", w.narrow(0, 2 * C, C).clone());
    } else if (r == "attn.proj.weight") {
      out.emplace_back(layer + "self_attn.o_proj.weight", w);
    } else if (r == "mlp_norm.weight") {
      out.emplace_back(layer + "post_attention_layernorm.weight", w);
    } else if (r == "mlp.fc.weight") {  // swiglu(h) = silu(h[:F]) * h[F:]
      out.emplace_back(layer + "mlp.gate_proj.weight", w.narrow(0, 0, F).clone());
      out.emplace_back(layer + "mlp.up_proj.weight", w.narrow(0, F, F).clone());
    } else if (r == "mlp.proj.weight") {
      out.emplace_back(layer + "mlp.down_proj.weight", w);
    } else {
      fail("parameter '{}' has no Llama counterpart", name);
    }
  }
  return out;
}

}  // namespace tributary
