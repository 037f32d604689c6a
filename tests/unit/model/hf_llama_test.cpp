// The Hugging Face Llama layout (model/hf_llama.h) against an independent Llama forward pass written from the
// Hugging Face formulas (modeling_llama: RMSNorm, rotate_half RoPE with inv_freq = theta^(-2i/D), causal softmax of
// q k^T / sqrt(D), SwiGLU = down(silu(gate x) * up x)) over the exported tensors only, and against transformers'
// LlamaForCausalLM itself, both ways: it loads our export, and its own checkpoints import into ours.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

#include "support/error_of.h"
#include "support/hf_python.h"
#include "tributary/artifacts/inference.h"
#include "tributary/core/fs.h"
#include "tributary/interop/hf_export.h"
#include "tributary/interop/hf_import.h"
#include "tributary/model/hf_llama.h"
#include "tributary/model/tensor_io.h"

using namespace tributary;

namespace {

ModelConfig llama_like(bool tied) {
  ModelConfig c;
  c.vocab_size = 61;
  c.num_layers = 4;
  c.num_levels = 2;  // blocks of two levels number on across them
  c.width = 32;
  c.num_heads = 4;
  c.context = 16;
  c.tie_embeddings = tied;
  c.rope_theta = 500.0;
  return c;
}

torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  auto h = x.chunk(2, -1);
  return torch::cat({-h[1], h[0]}, -1);
}

torch::Tensor hf_forward(const std::map<std::string, torch::Tensor>& w, const nlohmann::json& cfg,
                         const torch::Tensor& tokens) {
  const int64_t B = tokens.size(0), T = tokens.size(1), C = cfg["hidden_size"], H = cfg["num_attention_heads"];
  const int64_t D = C / H, L = cfg["num_hidden_layers"], KV = cfg["num_key_value_heads"];
  const double eps = cfg["rms_norm_eps"], theta = cfg["rope_theta"];
  auto x = w.at("model.embed_tokens.weight").index_select(0, tokens.reshape(-1)).view({B, T, C});
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, D, 2, torch::kFloat64) / double(D));
  auto freqs = torch::outer(torch::arange(T, torch::kFloat64), inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos().to(torch::kFloat32), sin = emb.sin().to(torch::kFloat32);
  auto mask = torch::ones({T, T}, torch::kBool).triu(1);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, -1, D}).transpose(1, 2); };
  auto repeat_kv = [&](const torch::Tensor& t) {
    return t.repeat_interleave(H / KV, 1);
  };  // modeling_llama's repeat_kv
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = rms(x, w.at(p + "input_layernorm.weight"), eps);
    auto q = heads(torch::matmul(h, w.at(p + "self_attn.q_proj.weight").t()));
    auto k = heads(torch::matmul(h, w.at(p + "self_attn.k_proj.weight").t()));
    auto v = heads(torch::matmul(h, w.at(p + "self_attn.v_proj.weight").t()));
    q = q * cos + rotate_half(q) * sin;
    k = repeat_kv(k * cos + rotate_half(k) * sin);
    v = repeat_kv(v);
    auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(D));
    auto att = torch::softmax(scores.masked_fill(mask, -INFINITY), -1);
    auto o = torch::matmul(att, v).transpose(1, 2).reshape({B, T, C});
    x = x + torch::matmul(o, w.at(p + "self_attn.o_proj.weight").t());
    h = rms(x, w.at(p + "post_attention_layernorm.weight"), eps);
    auto gate = torch::matmul(h, w.at(p + "mlp.gate_proj.weight").t());
    auto up = torch::matmul(h, w.at(p + "mlp.up_proj.weight").t());
    x = x + torch::matmul(torch::silu(gate) * up, w.at(p + "mlp.down_proj.weight").t());
  }
  x = rms(x, w.at("model.norm.weight"), eps);
  const bool tied = cfg["tie_word_embeddings"];
  return torch::matmul(x, w.at(tied ? "model.embed_tokens.weight" : "lm_head.weight").t());
}

}  // namespace

TEST(HfLlama, ExportedTensorsComputeOurLogitsWithTheHuggingFaceFormulas) {
  for (const auto& [tied, kv_heads] : {std::pair{true, 0}, std::pair{false, 0}, std::pair{true, 2}}) {
    torch::manual_seed(5);
    ModelConfig c = llama_like(tied);
    c.num_kv_heads = kv_heads;  // 2 of 4: grouped-query attention
    Transformer model(c);
    const auto cfg = nlohmann::json::parse(hf_llama_config_json(c));
    EXPECT_EQ(cfg["intermediate_size"], c.resolved_mlp_hidden());
    EXPECT_EQ(cfg["num_key_value_heads"], kv_heads > 0 ? kv_heads : c.num_heads);
    EXPECT_EQ(model.num_parameters(), c.num_parameters(c.vocab_size));
    std::map<std::string, torch::Tensor> w;
    for (auto& [name, t] : to_hf_llama(model)) EXPECT_TRUE(w.emplace(name, t).second) << "twice: " << name;
    EXPECT_EQ(w.size(), size_t(1 + 9 * c.num_layers + 1 + (tied ? 0 : 1))) << "tied " << tied;
    EXPECT_EQ(w.count("lm_head.weight"), tied ? 0u : 1u);
    auto tokens = torch::randint(c.vocab_size, {2, c.context}, torch::kInt64);
    torch::NoGradGuard no_grad;
    auto ours = model.forward(tokens), theirs = hf_forward(w, cfg, tokens);
    EXPECT_TRUE(torch::allclose(ours, theirs, 1e-4, 1e-5))
        << "tied " << tied << " kv heads " << kv_heads << " max diff " << (ours - theirs).abs().max().item<double>();
  }
}

TEST(HfLlama, TransformersLoadsOurExportAndComputesOurLogits) {
  // transformers' LlamaForCausalLM.from_pretrained reads config.json and model.safetensors as we write them
  // (tests/reference/hf_llama_logits.py, offline). Weights are drawn large (std 0.3, norm gains too) so that a
  // misplaced head or row changes the logits by far more than the tolerance.
  const std::vector<std::pair<bool, int64_t>> variants = {{true, 0}, {false, 0}, {true, 2}, {false, 2}};
  torch::manual_seed(7);
  auto tokens = torch::randint(61, {2, 16}, torch::kInt64);
  std::vector<torch::Tensor> ours;
  std::vector<fs::path> dirs;
  for (const auto& [tied, kv_heads] : variants) {
    ModelConfig c = llama_like(tied);
    c.num_kv_heads = kv_heads;  // 2 of 4: grouped-query attention
    Transformer model(c);
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters()) p.copy_(torch::randn_like(p) * 0.3);
    dirs.push_back(fs::temp_directory_path() / fmt::format("hf_export_{}_{}_{}", ::getpid(), tied, kv_heads));
    fs::create_directories(dirs.back());
    write_file_atomic(dirs.back() / "config.json", hf_llama_config_json(c));
    write_file_atomic(dirs.back() / "model.safetensors",
                      tensors_to_safetensors(to_hf_llama(model), {{"format", "pt"}}));
    ours.push_back(model.forward(tokens));
  }
  const auto theirs = test_support::transformers_logits(dirs, tokens, 61);
  for (size_t i = 0; i < variants.size(); ++i) {
    fs::remove_all(dirs[i]);
    EXPECT_GT(ours[i].abs().max().item<double>(), 1.0);  // logits far from 0: the comparison means something
    EXPECT_TRUE(torch::allclose(ours[i], theirs[i], 1e-4, 1e-4))
        << "tied " << variants[i].first << " kv heads " << variants[i].second << " max diff "
        << (ours[i] - theirs[i]).abs().max().item<double>();
  }
}

TEST(HfLlama, ALlamaMadeByTransformersImportsWithItsLogits) {
  // A random LlamaForCausalLM saved by transformers itself (rope_parameters, head_dim, several safetensors shards and
  // an index) goes through `tributary import`; the imported checkpoint computes transformers' own logits.
  const fs::path base = fs::temp_directory_path() / fmt::format("hf_made_{}", ::getpid());
  fs::remove_all(base);
  torch::manual_seed(8);
  auto tokens = torch::randint(257, {2, 24}, torch::kInt64);
  test_support::make_transformers_llamas(base, tokens, "mha-tied,mha-untied,gqa-tied,gqa-untied");
  for (const char* variant : {"mha-tied", "mha-untied", "gqa-tied", "gqa-untied"}) {
    const fs::path made = base / variant, run = base / (std::string(variant) + "-run");
    EXPECT_TRUE(fs::exists(made / "model.safetensors.index.json")) << variant;
    import_hf(made, run, "data/default");
    const LoadedModel imported = load_model(run.string(), torch::kCPU);
    EXPECT_EQ(imported.model->config().num_kv_heads, std::string(variant).starts_with("gqa") ? 2 : 0) << variant;
    EXPECT_EQ(imported.model->config().tie_embeddings, std::string(variant).ends_with("-tied")) << variant;
    torch::NoGradGuard no_grad;
    const auto ours = imported.model->forward(tokens);
    const auto theirs = test_support::read_logits(base / (std::string(variant) + ".f32"), tokens, 257);
    EXPECT_GT(theirs.abs().max().item<double>(), 1.0) << variant;
    EXPECT_TRUE(torch::allclose(ours, theirs, 1e-4, 1e-4))
        << variant << " max diff " << (ours - theirs).abs().max().item<double>();
  }
  fs::remove_all(base);
}

TEST(HfLlama, TodaysLlamaFamiliesMadeByTransformersImportAndExportWithItsLoss) {
  // Llama 3.1's scaled RoPE with its own head_dim, Qwen 2's q/k/v biases, Mistral and linear RoPE scaling, each a
  // random model saved by transformers itself: imported, our logits and loss are transformers'; exported back,
  // transformers loads our directory (as the family's own class) and computes the same logits again.
  const fs::path base = fs::temp_directory_path() / fmt::format("hf_families_{}", ::getpid());
  fs::remove_all(base);
  torch::manual_seed(9);
  auto tokens = torch::randint(257, {16, 32}, torch::kInt64);  // 16 windows
  const std::vector<std::string> variants = {"gqa-untied-llama3", "gqa-tied-qwen2", "gqa-untied-mistral",
                                             "mha-tied-linear"};
  test_support::make_transformers_llamas(base, tokens, fmt::format("{}", fmt::join(variants, ",")));
  std::vector<fs::path> exported;
  std::vector<torch::Tensor> ours;
  for (const auto& variant : variants) {
    const fs::path made = base / variant, run = base / (variant + "-run");
    import_hf(made, run, "data/default");
    const LoadedModel imported = load_model(run.string(), torch::kCPU);
    const ModelConfig& c = imported.model->config();
    if (variant.ends_with("llama3")) {
      EXPECT_EQ(c.rope_scaling, "llama3");
      EXPECT_EQ(c.head_dim(), 16);
    }
    if (variant.ends_with("linear")) {
      EXPECT_EQ(c.rope_scaling, "linear");
    }
    EXPECT_EQ(c.qkv_bias, variant.ends_with("qwen2"));
    torch::NoGradGuard no_grad;
    ours.push_back(imported.model->forward(tokens));
    const auto theirs = test_support::read_logits(base / (variant + ".f32"), tokens, 257);
    EXPECT_GT(theirs.abs().max().item<double>(), 1.0) << variant;
    EXPECT_TRUE(torch::allclose(ours.back(), theirs, 1e-4, 1e-4))
        << variant << " max diff " << (ours.back() - theirs).abs().max().item<double>();
    const double our_loss = test_support::next_token_loss(ours.back(), tokens),
                 their_loss = test_support::next_token_loss(theirs, tokens);
    EXPECT_LE(std::abs(our_loss - their_loss), 1e-5) << variant << ": " << our_loss << " against " << their_loss;
    std::printf("%s: loss %.7f, transformers' %.7f, |difference| %.2e\n", variant.c_str(), our_loss, their_loss,
                std::abs(our_loss - their_loss));
    exported.push_back(base / (variant + "-export"));
    export_hf(run.string(), exported.back());
  }
  const auto again = test_support::transformers_logits(exported, tokens, 257);
  for (size_t i = 0; i < variants.size(); ++i)
    EXPECT_TRUE(torch::allclose(again[i], ours[i], 1e-4, 1e-4))
        << variants[i] << " exported: max diff " << (again[i] - ours[i]).abs().max().item<double>();
  fs::remove_all(base);
}

TEST(HfLlama, AModelWithoutALlamaCounterpartIsRefusedNamingTheKey) {
  ModelConfig c = llama_like(true);
  c.mlp = "gelu";
  EXPECT_NE(test_support::error_of([&] { hf_llama_config_json(c); }).find("model.mlp = gelu"), std::string::npos);
  c = llama_like(true);
  c.positions = "learned";
  EXPECT_NE(test_support::error_of([&] { to_hf_llama(Transformer(c)); }).find("model.positions = learned"),
            std::string::npos);
}

TEST(HfLlama, ImportIsTheInverseOfExport) {
  // bf16 on disk (as many published checkpoints) reads as fp32; config.json gives back the model's shape.
  torch::manual_seed(6);
  const ModelConfig c = llama_like(false);
  Transformer model(c);
  std::map<std::string, torch::Tensor> hf;
  for (auto& [name, t] : to_hf_llama(model)) hf.emplace(name, t);
  const ModelConfig back = llama_model_config(hf_llama_config_json(c), "config.json");
  EXPECT_EQ(back.width, c.width);
  EXPECT_EQ(back.num_layers, c.num_layers);
  EXPECT_EQ(back.resolved_mlp_hidden(), c.resolved_mlp_hidden());
  EXPECT_EQ(back.tie_embeddings, false);
  EXPECT_DOUBLE_EQ(back.rope_theta, 500.0);
  Transformer imported(back);
  const auto params = from_hf_llama(imported, hf, "dir");
  const auto originals = named_parameters_of(Transformer(back));
  for (size_t i = 0; i < params.size(); ++i) {  // our names for one level; the model had two: compare by position
    const auto& t = params[i].second;
    EXPECT_EQ(params[i].first, originals[i].first);
    EXPECT_TRUE(torch::equal(t, named_parameters_of(model)[i].second.detach())) << params[i].first;
  }
  auto bf16 = hf;
  for (auto& [name, t] : bf16) t = t.to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(from_hf_llama(imported, bf16, "dir")[1].second,
                           hf.at("model.layers.0.input_layernorm.weight").to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST(HfLlama, ImportRefusesWhatTheModelCannotRepresentNamingTheField) {
  const ModelConfig c = llama_like(true);
  auto cfg = nlohmann::json::parse(hf_llama_config_json(c));
  auto error = [&](const nlohmann::json& j) {
    return test_support::error_of([&] { llama_model_config(j.dump(), "hf/config.json"); });
  };
  auto gqa = cfg;
  gqa["num_key_value_heads"] = 2;
  EXPECT_EQ(llama_model_config(gqa.dump(), "hf/config.json").num_kv_heads, 2);
  gqa["num_key_value_heads"] = 3;
  EXPECT_NE(error(gqa).find("hf/config.json: num_key_value_heads = 3 does not divide num_attention_heads = 4"),
            std::string::npos)
      << error(gqa);
  auto other = cfg;
  other["architectures"] = {"MistralForCausalLM"};  // model_type still says llama
  EXPECT_NE(error(other).find("only LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM"), std::string::npos)
      << error(other);
  other["model_type"] = "gemma";
  other["architectures"] = {"GemmaForCausalLM"};
  EXPECT_NE(error(other).find("GemmaForCausalLM"), std::string::npos) << error(other);
  auto bias = cfg;
  bias["attention_bias"] = true;  // Llama's puts one on o_proj too
  EXPECT_NE(error(bias).find("attention_bias = true"), std::string::npos);
  auto qwen = cfg;
  qwen["model_type"] = "qwen2";
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  EXPECT_TRUE(llama_model_config(qwen.dump(), "hf/config.json").qkv_bias);
  qwen["use_sliding_window"] = true;
  EXPECT_NE(error(qwen).find("use_sliding_window = true"), std::string::npos);
  auto rope = cfg;
  rope["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error(rope).find("RoPE of type 'yarn' is not supported"), std::string::npos) << error(rope);
  rope["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  EXPECT_EQ(llama_model_config(rope.dump(), "hf/config.json").rope_scaling, "linear");
  rope["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", -8.0}};
  EXPECT_NE(error(rope).find("'rope_scaling.factor' = -8.0 must be a positive finite number"), std::string::npos)
      << error(rope);
  auto mistral = cfg;
  mistral["model_type"] = "mistral";
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["sliding_window"] = 16;
  EXPECT_EQ(llama_model_config(mistral.dump(), "hf/config.json").context, 16) << "the context stays in the window";
  auto missing = cfg;
  missing.erase("hidden_size");
  EXPECT_NE(error(missing).find("'hidden_size' must be a positive integer"), std::string::npos);
  EXPECT_NE(test_support::error_of([] { llama_model_config("[1, 2]", "hf/config.json"); }).find("not a JSON object"),
            std::string::npos);

  Transformer model(c);
  std::map<std::string, torch::Tensor> hf;
  for (auto& [name, t] : to_hf_llama(model)) hf.emplace(name, t);
  auto without = hf;
  without.erase("model.layers.3.mlp.up_proj.weight");
  EXPECT_NE(test_support::error_of([&] {
              from_hf_llama(model, without, "hf");
            }).find("hf: tensor 'model.layers.3.mlp.up_proj.weight' is missing"),
            std::string::npos);
  auto misshapen = hf;
  misshapen["model.norm.weight"] = torch::ones({c.width + 1});
  EXPECT_NE(test_support::error_of([&] {
              from_hf_llama(model, misshapen, "hf");
            }).find("tensor 'model.norm.weight' has shape 33 where the config.json implies 32"),
            std::string::npos);
  auto extra = hf;
  extra["model.layers.0.self_attn.q_proj.bias"] = torch::zeros({c.width});
  extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch::zeros({4});  // a buffer: ignored
  EXPECT_NE(test_support::error_of([&] {
              from_hf_llama(model, extra, "hf");
            }).find("tensor 'model.layers.0.self_attn.q_proj.bias' has no place"),
            std::string::npos);
}

TEST(HfLlama, ImportReadsOnlyItsDirectorysOwnFilesAndBuildsOnlyAModelItsWeightsFill) {
  // Issue 46, items 6 and 7: links out of the directory were followed (a private key copied into the checkpoint, or
  // /dev/zero read until memory ran out), and config.json's model was built before any weight was read.
  ModelConfig c = llama_like(true);
  c.vocab_size = 257;  // the byte-level tokenizer's ids (a smaller vocabulary is refused)
  Transformer model(c);
  const fs::path dir = fs::temp_directory_path() / ("trib_hf_hostile_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "hf");
  write_file(dir / "hf" / "config.json", hf_llama_config_json(c));
  write_file(dir / "hf" / "model.safetensors", tensors_to_safetensors(to_hf_llama(model), {{"format", "pt"}}));
  write_file(dir / "hf" / "tributary_tokenizer.json", "{\"type\": \"byte\"}");
  auto import_error = [&](const std::string& out) {
    return test_support::error_of([&] { import_hf(dir / "hf", dir / out, "data/default"); });
  };
  import_hf(dir / "hf", dir / "ok", "data/default");  // as it is: imports
  write_file(dir / "secret", "a private key");
  fs::create_symlink(dir / "secret", dir / "hf" / "tokenizer.model");
  std::string msg = import_error("a");
  EXPECT_NE(msg.find("tokenizer.model' is a link to '" + (dir / "secret").string() + "', outside"), std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(dir / "a")) << "nothing written";
  fs::remove(dir / "hf" / "tokenizer.model");
  fs::rename(dir / "hf" / "model.safetensors", dir / "weights");
  fs::create_symlink("/dev/zero", dir / "hf" / "model.safetensors");
  msg = import_error("b");
  EXPECT_NE(msg.find("model.safetensors' is not a regular file"), std::string::npos) << msg;
  fs::remove(dir / "hf" / "model.safetensors");
  fs::create_symlink(dir / "weights", dir / "hf" / "model.safetensors");  // outside too
  EXPECT_NE(import_error("c").find("outside"), std::string::npos);
  fs::remove(dir / "hf" / "model.safetensors");
  fs::rename(dir / "weights", dir / "hf" / "model.safetensors");
  auto huge = nlohmann::json::parse(hf_llama_config_json(c));
  huge["hidden_size"] = 1 << 16;  // the most each key may say, together far more than the weights hold
  huge["intermediate_size"] = 1 << 20;
  huge["num_hidden_layers"] = 1024;
  write_file(dir / "hf" / "config.json", huge.dump());
  msg = import_error("d");
  EXPECT_NE(msg.find("config.json describes a model of"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not this model's weights"), std::string::npos) << msg;
  // A vocabulary without a row for every id of the tokenizer, or a tokenizer that does not load, is refused at
  // import, not at the first eval.
  auto small = c;
  small.vocab_size = 200;
  write_file(dir / "hf" / "config.json", hf_llama_config_json(small));
  write_file(dir / "hf" / "model.safetensors",
             tensors_to_safetensors(to_hf_llama(Transformer(small)), {{"format", "pt"}}));
  msg = import_error("f");
  EXPECT_NE(msg.find("vocab_size = 200 is smaller than the tokenizer's 257 ids"), std::string::npos) << msg;
  write_file(dir / "hf" / "config.json", hf_llama_config_json(c));
  write_file(dir / "hf" / "tokenizer.model", std::string("garbage\0\1", 9));
  write_file(dir / "hf" / "tributary_tokenizer.json", "{\"type\": \"sentencepiece\"}");
  msg = import_error("e");
  EXPECT_NE(msg.find("tokenizer.model"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "e")) << "nothing written";
  fs::remove_all(dir);
}

TEST(HfLlama, EveryKeyOfAnotherJsonTypeIsNamedNotACrash) {
  // Issue 46, item 8: a config.json key of another JSON type was a JSON library exception (status 3), and an
  // out-of-range rope_theta or rms_norm_eps imported fine and failed at eval.
  const auto good = nlohmann::json::parse(hf_llama_config_json(llama_like(true)));
  std::vector<std::string> keys;
  for (const auto& [key, value] : good.items()) keys.push_back(key);
  for (const char* extra : {"rope_parameters", "rope_scaling", "head_dim", "attention_bias", "mlp_bias", "hidden_act",
                            "architectures", "model_type"})
    keys.push_back(extra);
  const std::vector<nlohmann::json> values = {
      "text", nlohmann::json::array({1}), {{"a", 1}},           nullptr, true, -1, 1e308, 0.5,
      0,      {{"rope_type", 5}},         {{"rope_theta", "x"}}};
  int refused = 0;
  for (const auto& key : keys)
    for (const auto& value : values) {
      auto j = good;
      j[key] = value;
      try {
        llama_model_config(j.dump(), "hf/config.json");
      } catch (const Error& e) {
        refused += 1;
        EXPECT_NE(std::string(e.what()).find("hf/config.json"), std::string::npos) << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << key << " = " << value.dump() << ": " << e.what();
      }
    }
  EXPECT_GT(refused, 100);
  for (const char* key : {"rope_theta", "rms_norm_eps"}) {
    auto j = good;
    j[key] = -1.0;
    EXPECT_NE(test_support::error_of([&] {
                llama_model_config(j.dump(), "hf/config.json");
              }).find(std::string("'") + key + "' = -1.0 must be a positive finite number"),
              std::string::npos)
        << key;
  }  // Positive but beyond what a run's model.rope_theta / model.norm_eps allow: refused here, not at the first load.
  for (const auto& [key, value] : std::vector<std::pair<std::string, double>>{
           {"rope_theta", 0.5}, {"rope_theta", 1e300}, {"rms_norm_eps", 1e300}, {"rms_norm_eps", 2.0}}) {
    auto j = good;
    j[key] = value;
    EXPECT_NE(test_support::error_of([&] { llama_model_config(j.dump(), "hf/config.json"); }).find("'" + key + "' = "),
              std::string::npos)
        << key << " = " << value;
  }
}
