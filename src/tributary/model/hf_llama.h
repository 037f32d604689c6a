// Our dense model in the Hugging Face Llama layout (LlamaForCausalLM, transformers' modeling_llama): the same
// computation (RMSNorm, rotate-half RoPE, SwiGLU, causal attention scaled by 1/sqrt(D)) under its names, with our
// fused projections split: attn.qkv = [q_proj; k_proj; v_proj] (rows; k and v have num_key_value_heads heads),
// mlp.fc = [gate_proj; up_proj].
#pragma once

#include <map>
#include <string>

#include "tributary/model/config.h"
#include "tributary/model/tensor_io.h"
#include "tributary/model/transformer.h"

namespace tributary {

// Error naming the key when the model has no Llama counterpart (model.mlp = gelu, model.positions = learned).
void check_llama_shaped(const ModelConfig& config);
// config.json of LlamaForCausalLM for `config` (vocab_size resolved, i.e. the model's).
std::string hf_llama_config_json(const ModelConfig& config);
// Every parameter under its Hugging Face name: model.embed_tokens, model.layers.N.{input_layernorm, self_attn.
// {q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, and lm_head when untied. Blocks are
// numbered in model order across levels.
NamedTensors to_hf_llama(const Transformer& model);

// The inverse (import): our parameters for `model` (built from llama_model_config) from the Hugging Face tensors by
// name, any float dtype, converted to fp32. Error naming `origin` and the tensor: one missing, misshapen, or with no
// place in the model (biases, other architectures; rotary_emb.inv_freq buffers are ignored).
NamedTensors from_hf_llama(const Transformer& model, const std::map<std::string, torch::Tensor>& hf,
                           const std::string& origin);
// Our model configuration from a LlamaForCausalLM config.json (context = max_position_embeddings). Error naming
// `origin` and the field for what the model cannot represent: another architecture, num_key_value_heads that does not
// divide num_attention_heads (fewer that do: grouped-query attention, model.num_kv_heads), biases, rope_scaling,
// another activation.
ModelConfig llama_model_config(const std::string& json_text, const std::string& origin);

}  // namespace tributary
