#include "samples/golden/golden_capsules.h"

#include <zstd.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/derivation.h"
#include "capsule/format/envelope.h"

namespace capsule::golden {
namespace {

constexpr int64_t kCreated = 1780000000000000;  // fixed: golden bytes must not depend on the clock

void FillCommon(v1::Capsule& c) {
  c.set_writer_version("0.1.0");
  c.set_created_unix_micros(kCreated);
  c.set_run_name("golden");
}

v1::HealthStats Stats(int64_t numel, double lo, double hi, int64_t nan) {
  v1::HealthStats s;
  s.set_numel(numel);
  s.set_nan_count(nan);
  s.set_min(lo);
  s.set_max(hi);
  s.set_absmax(std::max(std::fabs(lo), std::fabs(hi)));
  s.set_mean((lo + hi) / 2);
  s.set_rms(std::max(std::fabs(lo), std::fabs(hi)) / 2);
  s.set_first_nonfinite_index(nan > 0 ? 3 : -1);
  return s;
}

}  // namespace

void FillGeneration(v1::Generation* gen) {
  gen->set_prompt_length(3);
  gen->set_prefill_chunk(2);
  gen->mutable_sampling()->set_temperature(0.7);
  gen->mutable_sampling()->set_top_k(40);
  gen->mutable_sampling()->set_top_p(0.9);
  gen->mutable_sampling()->set_seed(11);
  gen->mutable_sampling()->add_stop_tokens(10);
  gen->mutable_cache()->set_layout("batch,kv_heads,position,head_dim");
  gen->mutable_cache()->set_dtype("float32");
  gen->mutable_cache()->set_post_rotation_keys(true);
  gen->mutable_cache()->set_quant_scale(0.5);
  gen->set_adapter_merged(true);
  gen->set_adapter_name("golden-lora");
  gen->set_adapter_rank(8);
  gen->set_adapter_alpha(16);
  gen->set_adapter_sha256(*Sha256Hex("golden adapter"));
  gen->set_tokenizer_sha256(*Sha256Hex("golden tokenizer"));
  gen->set_template_sha256(*Sha256Hex("golden template"));
}

void FillDistributed(v1::Distributed* dist, int64_t time_base) {
  dist->set_run_id("run-5f3a9c");
  dist->set_backend("gloo");
  dist->set_group_name("default_pg");
  dist->set_sequence_base(1804289384);
  for (int i = 0; i < 2; ++i) {
    v1::Collective* k = dist->add_collectives();
    k->set_sequence(40 + i);
    k->set_op("allreduce");
    k->set_tag(i == 0 ? "grads" : "capsule.agree");
    k->set_group("default_pg");
    k->add_ranks(0);
    k->add_ranks(1);
    k->set_dtype("float32");
    k->set_numel(i == 0 ? 1024 : 8);
    k->add_in_shapes()->add_dims(k->numel());
    k->add_out_shapes()->add_dims(k->numel());
    k->set_reduce_op("sum");
    k->set_root(1);
    k->set_state(i == 0 ? v1::COMPLETED : v1::FAILED);
    k->set_enqueued_unix_micros(time_base + i);
    k->set_completed_unix_micros(time_base + 100 + i);
    k->set_error(i == 0 ? "" : "Connection closed by peer");
    k->set_step(7);
    k->set_peer(1);  // every field set, as root is: a real collective leaves both 0
    k->set_carries_agreement(i == 0);
  }
  {
    v1::Collective* p = dist->add_point_to_point();
    *p = dist->collectives(1);
    p->set_sequence(3);
    p->set_op("recv");
    p->set_tag("act");
    p->set_root(1);
    p->set_peer(1);
    p->set_carries_agreement(true);
  }
  v1::FinishedRank* finished = dist->add_finished();
  finished->set_rank(1);
  finished->set_last_step(6);
  v1::GradReduction* reduction = dist->add_reductions();
  reduction->set_step(7);
  reduction->set_sequence(40);
  reduction->set_local_norm(INFINITY);
  reduction->set_local_non_finite(3);
  reduction->set_global_norm(INFINITY);
  reduction->set_global_non_finite(3);
  reduction->set_divisor(2);
  reduction->add_rank_local_norms(1.5);
  reduction->add_rank_local_norms(INFINITY);
  reduction->add_rank_local_non_finite(0);
  reduction->add_rank_local_non_finite(3);
  v1::StepFingerprint* fp = dist->add_fingerprints();
  fp->set_step(7);
  fp->set_params("0123456789abcdef");
  fp->set_replicated_rng("00000000000000aa");
  fp->set_local_rng("00000000000000bb");
  fp->set_cursor_epoch(1);
  fp->set_cursor_offset(56);
  fp->set_sample_ids("00000000000000cc");
  v1::TriggerAgreement* agree = dist->mutable_agreement();
  agree->set_step(7);
  v1::RankTrigger* fired = agree->add_fired();
  fired->set_rank(1);
  fired->set_kind(v1::NON_FINITE_LOSS);
  agree->add_missing_ranks(0);
  agree->set_error("Connection closed by peer");
  v1::ThreadPosition* thread = dist->add_threads();
  thread->set_thread("trainer");
  thread->set_position("collective grads (sequence 40)");
  thread->set_step(7);
  thread->set_seconds(3.5);
  dist->set_last_step(7);
  dist->set_watchdog_seconds(3);
  dist->set_timeout_seconds(10);
  dist->set_dump_key("capsule/run-5f3a9c/dump");
  dist->set_dump_reason("rank 1: HANG at step 7, sequence 41");
}

v1::TensorBlob MakeFloatBlob(const std::string& name, const std::vector<int64_t>& shape,
                             const std::vector<float>& values) {
  v1::TensorBlob t;
  t.set_name(name);
  t.mutable_meta()->set_dtype(v1::FLOAT32);
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    t.mutable_meta()->add_shape(shape[i]);
    t.mutable_meta()->add_strides(strides[i]);
  }
  t.mutable_meta()->set_device("cpu");
  std::string data(values.size() * sizeof(float), '\0');
  std::memcpy(data.data(), values.data(), data.size());  // x86-64 and aarch64: little-endian
  t.set_sha256(*Sha256Hex(data));
  t.set_data(std::move(data));
  return t;
}

v1::Capsule MakeMinimalCapsule() {
  v1::Capsule c;
  FillCommon(c);
  c.mutable_trigger()->set_kind(v1::MANUAL);
  c.mutable_trigger()->set_message("golden minimal capsule");
  c.mutable_step()->set_global_step(0);
  return c;
}

v1::Capsule MakeFullCapsule() {
  v1::Capsule c;
  FillCommon(c);
  c.set_run_name("golden-full");

  v1::Trigger& t = *c.mutable_trigger();
  t.set_kind(v1::NON_FINITE_LOSS);
  t.set_observed(std::nan(""));
  t.set_threshold(0);
  t.set_rule("loss is not finite");
  t.set_wall_time_unix_micros(kCreated - 5);
  t.set_message("loss became nan at step 5");
  t.set_capture_rerun(v1::RERUN_REPRODUCED);
  t.set_rerun_observed(std::nan(""));

  v1::StepInfo& step = *c.mutable_step();
  step.set_global_step(5);
  step.set_micro_batch(1);
  step.set_tokens_seen(5 * 2 * 4);
  step.set_epoch(0);
  for (int i = 0; i <= 5; ++i) {
    v1::StepScalars& h = *step.add_history();
    h.set_step(i);
    h.set_loss(i < 5 ? 5.5 - 0.1 * i : std::nan(""));
    h.set_grad_norm(1.0 + 0.01 * i);
    h.set_update_norm(0.001);
    h.set_param_norm(12.5);
    h.set_learning_rate(3e-4);
    h.set_weight_decay(0.1);
    h.set_loss_scale(1.0);
  }

  v1::DataBatch& data = *c.mutable_data();
  data.set_labels_shifted(true);
  for (int s = 0; s < 2; ++s) {
    v1::Sequence& seq = *data.add_sequences();
    seq.set_sample_id("sample-" + std::to_string(10 + s));
    const std::string text = s == 0 ? "abcd" : "wxyz";
    for (char ch : text) seq.add_token_ids(static_cast<unsigned char>(ch));
    for (size_t i = 1; i < text.size(); ++i) seq.add_labels(static_cast<unsigned char>(text[i]));
    seq.add_labels(-100);
    seq.set_attention_mask(std::string(4, '\1'));
    seq.set_loss_mask(std::string("\1\1\1\0", 4));
    seq.set_raw_text(text);
    seq.set_token_count(4);
  }
  data.mutable_cursor()->set_epoch(0);
  data.mutable_cursor()->set_shard(3);
  data.mutable_cursor()->set_offset(10);
  data.mutable_cursor()->add_sample_indices(10);
  data.mutable_cursor()->add_sample_indices(11);
  data.mutable_cursor()->set_sampler_rng("sampler");
  data.add_tensor_names("input_ids");

  v1::Identity& id = *c.mutable_identity();
  const std::string tokenizer = "{\"type\":\"byte-level\",\"vocab_size\":256}";
  v1::FileIdentity& f = *id.add_files();
  f.set_role("tokenizer");
  f.set_name("tokenizer.json");
  f.set_path("/data/tiny/tokenizer.json");
  f.set_size_bytes(static_cast<int64_t>(tokenizer.size()));
  f.set_sha256(*Sha256Hex(tokenizer));
  id.set_model_sha256(*Sha256Hex("golden model"));
  id.set_model_parameter_count(12);
  id.set_chat_template("{{ user }}\n{{ assistant }}");
  id.set_config_text("lr: 3e-4\nbatch: 2\n");
  id.set_config_sha256(*Sha256Hex(id.config_text()));
  id.set_code_revision("0123456789abcdef0123456789abcdef01234567");

  v1::RngBlob& g = *c.mutable_rng()->add_generators();
  g.set_name("torch.cpu");
  g.set_kind(v1::TORCH_CPU_GENERATOR);
  g.set_device("cpu");
  g.set_torch_version("1.13.0");
  g.set_state(std::string(64, '\x5a'));
  g.set_seed(1234);
  v1::RngBlob& sampler = *c.mutable_rng()->add_generators();
  sampler.set_name("sampler");
  sampler.set_kind(v1::USER);
  sampler.set_device("cpu");
  sampler.set_state("mt19937_64:42");
  sampler.set_seed(42);

  v1::Numerics& n = *c.mutable_numerics();
  const char* names[] = {"embed", "blocks.0", "loss"};
  for (int i = 0; i < 3; ++i) {
    v1::LayerStats& l = *n.add_layers();
    l.set_index(i);
    l.set_name(names[i]);
    l.set_phase(v1::FORWARD);
    l.mutable_meta()->set_dtype(v1::FLOAT32);
    l.mutable_meta()->add_shape(2);
    l.mutable_meta()->add_shape(4);
    l.mutable_meta()->add_strides(4);
    l.mutable_meta()->add_strides(1);
    l.mutable_meta()->set_device("cpu");
    *l.mutable_stats() = Stats(8, -1.5, 2.0, i == 1 ? 2 : 0);
    l.set_anomalous(i == 1);
  }
  v1::LayerStats& back = *n.add_layers();
  back.set_index(1);
  back.set_name("blocks.0");
  back.set_phase(v1::BACKWARD);
  *back.mutable_stats() = Stats(8, -0.1, 0.1, 0);
  n.set_first_anomalous_layer("blocks.0");
  n.set_first_anomalous_index(1);
  n.set_first_anomalous_phase(v1::FORWARD);
  n.set_anomaly_reason("2 NaN in forward output");
  n.set_intra_op_threads(2);
  n.set_path(v1::OPTIMIZED);

  v1::TensorBlob ids;
  ids.set_name("input_ids");
  ids.mutable_meta()->set_dtype(v1::INT64);
  ids.mutable_meta()->add_shape(2);
  ids.mutable_meta()->add_shape(4);
  std::string id_bytes;
  for (const auto& seq : data.sequences()) {
    for (int64_t tok : seq.token_ids()) id_bytes.append(reinterpret_cast<const char*>(&tok), 8);
  }
  ids.set_sha256(*Sha256Hex(id_bytes));
  ids.set_data(id_bytes);
  ids.set_role(v1::BATCH_INPUT);
  *c.add_tensors() = ids;
  v1::TensorBlob w = MakeFloatBlob("blocks.0.mlp.fc1.weight", {2, 3}, {1, -2, 3, -4, 5, -6});
  w.set_role(v1::PARAMETER);
  w.set_layer("blocks.0");
  w.mutable_meta()->set_requires_grad(true);
  *c.add_tensors() = w;
  v1::TensorBlob x = MakeFloatBlob("blocks.0/input", {2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  x.set_role(v1::LAYER_INPUT);
  x.set_layer("blocks.0");
  *c.add_tensors() = x;

  v1::Placement& p = *c.mutable_placement();
  p.set_rank(1);
  p.set_world_size(2);
  p.set_local_rank(1);
  p.set_data_parallel_rank(1);
  p.set_tensor_parallel_rank(0);
  p.set_pipeline_parallel_rank(0);
  p.set_device("cpu");

  v1::Environment& e = *c.mutable_environment();
  e.set_capsule_version("0.1.0");
  e.set_torch_version("1.13.0");
  e.set_compiler("GCC 12.2.0");
  e.set_os("Linux 6.1.0");
  e.set_kernel("#1 SMP Debian");
  e.set_cpu_model("golden cpu");
  e.add_cpu_flags("avx2");
  e.add_cpu_flags("fma");
  e.set_blas("openblas");
  e.set_intra_op_threads(2);
  e.set_inter_op_threads(1);
  e.set_deterministic_algorithms(true);
  (*e.mutable_libraries())["zstd"] = "1.5.4";
  (*e.mutable_libraries())["protobuf"] = "3.21.12";
  e.set_hostname("golden-host");
  e.add_cuda_devices("none");
  e.set_cuda_version("");
  e.set_torch_config("golden");

  v1::LogRecord& log = *c.mutable_log();
  log.add_lines("step 4 loss 5.1");
  log.add_lines("step 5 loss nan");
  log.set_error("loss is nan");
  log.add_backtrace("trainer.cc:42 TrainStep");

  v1::ModelSpec& m = *c.mutable_model();
  m.set_registry_name("tiny_gpt");
  m.set_config_json("{\"n_layers\":1}");
  m.set_trainer_path(v1::OPTIMIZED);
  m.set_weight_policy(v1::WEIGHTS_ANOMALOUS_LAYER);
  for (const char* name : names) m.add_layers(name);
  v1::WeightsReference& ref = *m.mutable_weights_reference();
  ref.set_path("/data/ckpt/model-step4.pt");
  ref.set_size_bytes(1 << 20);
  ref.set_file_sha256(*Sha256Hex("golden checkpoint file"));
  ref.set_format("torch_pickle");
  ref.set_tensors_sha256(*Sha256Hex("golden checkpoint tensors"));
  for (const char* name : {"blocks.0.weight", "embed.weight"}) {
    v1::TensorDigest& d = *ref.add_tensors();
    d.set_name(name);
    d.set_dtype("Float");
    d.add_shape(4);
    d.add_shape(4);
    d.set_sha256(*Sha256Hex(name));
  }
  ref.set_matches_step(true);

  FillDistributed(c.mutable_distributed(), kCreated);

  FillGeneration(c.mutable_generation());

  c.mutable_redaction()->set_redacted_unix_micros(0);
  (*c.mutable_annotations())["experiment"] = "golden";
  (*c.mutable_annotations())["owner"] = "capsule";
  return c;
}

StatusOr<PrivateKey> LoadTestOnlyKey(const std::string& path) {
  CAPSULE_ASSIGN_OR_RETURN(std::string pem, ReadFileBytes(path, 1 << 16));
  return ParsePrivateKeyPem(pem);
}

namespace {

// A real zstd frame of `size` zero bytes, compressed in streaming mode so nothing of that size is
// ever allocated: a well-formed decompression bomb.
StatusOr<std::string> ZeroBombFrame(uint64_t size) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setPledgedSrcSize(cctx, size);
  std::string zeros(1 << 20, '\0');
  std::string out;
  std::string buf(ZSTD_CStreamOutSize(), '\0');
  uint64_t left = size;
  while (true) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
    left -= chunk;
    ZSTD_inBuffer in{zeros.data(), chunk, 0};
    const ZSTD_EndDirective mode = left == 0 ? ZSTD_e_end : ZSTD_e_continue;
    size_t remaining;
    do {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      remaining = ZSTD_compressStream2(cctx, &o, &in, mode);
      if (ZSTD_isError(remaining)) {
        ZSTD_freeCCtx(cctx);
        return InternalError(ZSTD_getErrorName(remaining));
      }
      out.append(buf.data(), o.pos);
    } while (mode == ZSTD_e_end ? remaining != 0 : in.pos < in.size);
    if (left == 0) break;
  }
  ZSTD_freeCCtx(cctx);
  return out;
}

}  // namespace

StatusOr<std::vector<GoldenFile>> MakeGoldenFiles(const PrivateKey& key, const PrivateKey& other) {
  std::vector<GoldenFile> files;
  WriteOptions signed_opts;
  signed_opts.signing_key = &key;
  WriteOptions unsigned_opts;

  CAPSULE_ASSIGN_OR_RETURN(std::string minimal, EncodeCapsule(MakeMinimalCapsule(), signed_opts));
  CAPSULE_ASSIGN_OR_RETURN(std::string full, EncodeCapsule(MakeFullCapsule(), signed_opts));
  CAPSULE_ASSIGN_OR_RETURN(std::string unsig, EncodeCapsule(MakeMinimalCapsule(), unsigned_opts));
  files.push_back({"valid/minimal.capsule", minimal, StatusCode::kOk});
  files.push_back({"valid/full.capsule", full, StatusCode::kOk});
  // Valid, but a reader refuses it unless it allows unsigned capsules.
  files.push_back({"valid/unsigned.capsule", unsig, StatusCode::kUnauthenticated});

  std::string bad_magic = minimal;
  bad_magic[1] = 'X';
  files.push_back({"invalid/bad_magic.capsule", bad_magic, StatusCode::kInvalidArgument});
  files.push_back({"invalid/truncated.capsule", minimal.substr(0, minimal.size() / 2),
                   StatusCode::kOutOfRange});

  // Re-seal the same payload with a future version / an unknown required flag, properly signed:
  // only the version rule can reject them.
  CAPSULE_ASSIGN_OR_RETURN(OpenedEnvelope env, OpenEnvelope(minimal, [&] {
                             OpenOptions o;
                             o.allow_untrusted = true;
                             return o;
                           }()));
  SealOptions future;
  future.signing_key = &key;
  future.major = kFormatMajor + 1;
  CAPSULE_ASSIGN_OR_RETURN(std::string future_bytes,
                           SealEnvelope(env.payload, env.info.header.uncompressed_size, future));
  files.push_back({"invalid/future_major.capsule", future_bytes, StatusCode::kUnimplemented});
  SealOptions flagged;
  flagged.signing_key = &key;
  flagged.required_flags = 1u << 7;
  CAPSULE_ASSIGN_OR_RETURN(std::string flag_bytes,
                           SealEnvelope(env.payload, env.info.header.uncompressed_size, flagged));
  files.push_back(
      {"invalid/unknown_required_flag.capsule", flag_bytes, StatusCode::kUnimplemented});

  std::string flipped = full;
  flipped[kHeaderSizeV1 + env.payload.size() / 2] ^= 0x01;
  files.push_back({"invalid/payload_flipped.capsule", flipped, StatusCode::kDataLoss});

  WriteOptions other_opts;
  other_opts.signing_key = &other;
  CAPSULE_ASSIGN_OR_RETURN(std::string other_bytes,
                           EncodeCapsule(MakeMinimalCapsule(), other_opts));
  files.push_back({"invalid/other_key.capsule", other_bytes, StatusCode::kUnauthenticated});

  // Made from other capsules (format/derivation.h): from minimal.capsule, whose signer the maker
  // trusted, and from other_key.capsule, whose signer it did not. Both signed with `key`; the
  // second is refused by a reader trusting `key` alone, as its source would be.
  constexpr int64_t kDerivedAt = 1780000000000000;
  for (const auto& [name, source, trusted] :
       {std::tuple<const char*, const std::string*, bool>{"valid/derived.capsule", &minimal, true},
        {"valid/derived-from-untrusted.capsule", &other_bytes, false}}) {
    OpenOptions open;
    if (trusted) {
      CAPSULE_ASSIGN_OR_RETURN(PublicKey pub, key.GetPublicKey());
      open.trusted_keys.push_back(pub);
    } else {
      open.allow_untrusted = true;
    }
    CAPSULE_ASSIGN_OR_RETURN(OpenedEnvelope source_env, OpenEnvelope(*source, open));
    CAPSULE_ASSIGN_OR_RETURN(std::string source_sha256, Sha256Hex(*source));
    v1::Capsule derived = MakeMinimalCapsule();
    derived.set_run_name(trusted ? "golden-derived" : "golden-derived-from-untrusted");
    CAPSULE_RETURN_IF_ERROR(RecordDerivation(MakeMinimalCapsule(), source_env.info, source_sha256,
                                             trusted ? "redact" : "extract", kDerivedAt, &derived));
    CAPSULE_ASSIGN_OR_RETURN(std::string bytes, EncodeCapsule(derived, signed_opts));
    files.push_back({name, bytes, trusted ? StatusCode::kOk : StatusCode::kUnauthenticated});
  }

  // 1.5 GiB of zeros: over the default 1 GiB cap, refused before anything is allocated.
  const uint64_t bomb_size = uint64_t{3} << 29;
  CAPSULE_ASSIGN_OR_RETURN(std::string bomb, ZeroBombFrame(bomb_size));
  SealOptions bomb_seal;
  bomb_seal.signing_key = &key;
  CAPSULE_ASSIGN_OR_RETURN(std::string bomb_bytes, SealEnvelope(bomb, bomb_size, bomb_seal));
  files.push_back({"invalid/over_size_cap.capsule", bomb_bytes, StatusCode::kResourceExhausted});
  return files;
}

}  // namespace capsule::golden
