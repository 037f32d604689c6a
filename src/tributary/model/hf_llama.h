// Our dense model in the Hugging Face Llama layout (LlamaForCausalLM, transformers' modeling_llama): the same
// computation (RMSNorm, rotate-half RoPE, SwiGLU, causal attention scaled by 1/sqrt(D)) under its names, with our
// fused projections split: attn.qkv = [q_proj; k_proj; v_proj] (rows), mlp.fc = [gate_proj; up_proj].
#pragma once

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

}  // namespace tributary
