#include "tests/format/capsule_test_util.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "capsule/base/internal/little_endian.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "samples/golden/golden_capsules.h"

namespace capsule::test {
using ::capsule::internal::LoadLe16;
using ::capsule::internal::LoadLe32;
using ::capsule::internal::LoadLe64;
using ::capsule::internal::StoreLe16;
using ::capsule::internal::StoreLe32;
using ::capsule::internal::StoreLe64;
namespace {

// Little-endian bytes of float values (the host of these tests is little-endian, as the format).
std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
std::string Int64Bytes(const std::vector<int64_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

void FillStats(v1::HealthStats* s, int64_t numel, int64_t nan, int64_t first_nonfinite) {
  s->set_numel(numel);
  s->set_nan_count(nan);
  s->set_pos_inf_count(1);
  s->set_neg_inf_count(1);
  s->set_zero_count(1);
  s->set_min(-2.5);
  s->set_max(3.5);
  s->set_absmax(3.5);
  s->set_mean(0.25);
  s->set_rms(1.75);
  s->set_first_nonfinite_index(first_nonfinite);
}

void FillMeta(v1::TensorMeta* m, v1::DType dtype, std::vector<int64_t> shape) {
  m->set_dtype(dtype);
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  for (int64_t d : shape) m->add_shape(d);
  for (int64_t s : strides) m->add_strides(s);
  m->set_storage_offset(3);
  m->set_device("cpu");
  m->set_requires_grad(true);
}

std::string Trailer(std::string_view header, std::string_view payload, const PrivateKey* key) {
  const std::string message = ExpectedSignedMessage(header, payload);
  std::string key_id(32, '\0');
  std::string signature;
  uint16_t alg = 0;
  if (key != nullptr) {
    key_id = OrDie(key->GetPublicKey()).KeyId();
    signature = OrDie(Sign(*key, message));
    alg = 1;
  }
  std::string t(8, '\0');
  StoreLe16(&t[0], alg);
  StoreLe16(&t[2], static_cast<uint16_t>(signature.size()));
  t += key_id;
  t += *Sha256(message);
  t += signature;
  char size[4];
  StoreLe32(size, static_cast<uint32_t>(84 + signature.size()));
  t.append(size, 4);
  t.append("\211CPSEND\n", 8);  // octal: "\x89C" would be one hex escape
  return t;
}

void MarkSet(const google::protobuf::Message& m, const std::string& path,
             std::set<std::string>* set) {
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string name = path + f->name();
    if (f->is_repeated()) {
      const int n = r->FieldSize(m, f);
      if (n == 0) continue;
      set->insert(name);
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        for (int j = 0; j < n; ++j) MarkSet(r->GetRepeatedMessage(m, f, j), name + "[].", set);
      }
    } else if (r->HasField(m, f)) {
      set->insert(name);
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        MarkSet(r->GetMessage(m, f), name + ".", set);
      }
    }
  }
}

void ListUnset(const google::protobuf::Descriptor* d, const std::string& path,
               const std::set<std::string>& set, std::vector<std::string>* unset) {
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string name = path + f->name();
    if (set.count(name) == 0) {
      unset->push_back(name);
      continue;
    }
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      ListUnset(f->message_type(), name + (f->is_repeated() ? "[]." : "."), set, unset);
    }
  }
}

}  // namespace

PrivateKey FixedKey(char fill) { return OrDie(PrivateKey::FromRaw(std::string(32, fill))); }

void SetTensor(v1::TensorBlob* t, const std::string& name, v1::DType dtype,
               const std::vector<int64_t>& shape, const std::string& data) {
  t->set_name(name);
  FillMeta(t->mutable_meta(), dtype, shape);
  t->mutable_meta()->set_storage_offset(0);
  t->set_data(data);
  t->set_sha256(*Sha256Hex(data));
}

v1::Capsule MakeMinimalCapsule() {
  v1::Capsule c;
  c.set_writer_version("0.1.0");
  c.set_created_unix_micros(1700000000000000);
  c.mutable_trigger()->set_kind(v1::NON_FINITE_LOSS);
  c.mutable_step()->set_global_step(7);
  return c;
}

v1::Capsule MakeFullCapsule() {
  v1::Capsule c;
  c.set_writer_version("0.1.0");
  c.set_created_unix_micros(1700000000123456);
  c.set_run_name("tiny-gpt/run 1");

  v1::Trigger* trigger = c.mutable_trigger();
  trigger->set_kind(v1::LOSS_SPIKE);
  trigger->set_observed(12.5);
  trigger->set_threshold(4.25);
  trigger->set_rule("loss > median(last 50) + 6*MAD");
  trigger->set_wall_time_unix_micros(1700000000123000);
  trigger->set_message("spike at step 1234");
  trigger->set_capture_rerun(v1::RERUN_REPRODUCED);
  trigger->set_rerun_observed(12.5);

  v1::StepInfo* step = c.mutable_step();
  step->set_global_step(1234);
  step->set_micro_batch(1);
  step->set_tokens_seen(1234 * 512);
  step->set_epoch(2);
  for (int64_t s = 1232; s <= 1234; ++s) {
    v1::StepScalars* h = step->add_history();
    h->set_step(s);
    h->set_loss(2.0 + static_cast<double>(s - 1232) * 5);
    h->set_grad_norm(0.5);
    h->set_update_norm(0.01);
    h->set_param_norm(42.0);
    h->set_learning_rate(3e-4);
    h->set_weight_decay(0.1);
    h->set_loss_scale(1.0);
  }
  // One entry with every optional absent: presence must round-trip, not just values.
  step->mutable_history(0)->clear_loss_scale();
  step->mutable_history(0)->clear_update_norm();

  v1::DataBatch* data = c.mutable_data();
  for (int i = 0; i < 2; ++i) {
    v1::Sequence* seq = data->add_sequences();
    seq->set_sample_id("sample-" + std::to_string(i));
    for (int64_t t : {5, 17, 3, 99}) seq->add_token_ids(t + i);
    for (int64_t t : {17, 3, 99, -100}) seq->add_labels(t + (t < 0 ? 0 : i));
    seq->set_attention_mask(std::string("\x01\x01\x01\x00", 4));
    seq->set_loss_mask(std::string("\x01\x01\x00\x00", 4));
    seq->set_response_mask(std::string("\x00\x01\x01\x01", 4));
    // The second sample's window ends mid-character: kept as bytes.
    if (i == 0) {
      seq->set_raw_text("the quick brown fox " + std::to_string(i));
    } else {
      seq->set_raw_bytes("the quick brown caf\xc3");
    }
    seq->set_token_ids_sha256(*Sha256Hex(Int64Bytes({5, 17, 3, 99})));
    seq->set_token_count(4);
    seq->set_micro_batch(i);
  }
  data->set_labels_shifted(true);
  data->set_micro_batches(2);
  data->set_eval_mode(true);
  v1::DataCursor* cursor = data->mutable_cursor();
  cursor->set_epoch(2);
  cursor->set_shard(3);
  cursor->set_offset(4096);
  cursor->add_sample_indices(77);
  cursor->add_sample_indices(78);
  cursor->set_sampler_rng("sampler");
  data->add_tensor_names("input_ids");

  v1::Identity* id = c.mutable_identity();
  v1::FileIdentity* tok = id->add_files();
  tok->set_role("tokenizer");
  tok->set_name("tokenizer.json");
  tok->set_path("/data/tok/tokenizer.json");
  tok->set_size_bytes(2048);
  tok->set_sha256(*Sha256Hex("tokenizer bytes"));
  v1::FileIdentity* tmpl = id->add_files();
  tmpl->set_role("chat_template");
  tmpl->set_name("template.jinja");
  tmpl->set_path("/data/tok/template.jinja");
  tmpl->set_size_bytes(64);
  tmpl->set_sha256(*Sha256Hex("template bytes"));
  id->set_model_sha256(*Sha256Hex("model"));
  id->set_model_parameter_count(123456);
  id->set_chat_template("{{ bos }}{{ text }}");
  id->set_config_text("{\"d_model\": 64, \"n_layers\": 2}");
  id->set_config_sha256(*Sha256Hex(id->config_text()));
  id->set_code_revision("0123456789abcdef0123456789abcdef01234567");

  for (const char* name : {"torch.cpu", "sampler"}) {
    v1::RngBlob* g = c.mutable_rng()->add_generators();
    g->set_name(name);
    g->set_kind(std::string(name) == "sampler" ? v1::USER : v1::TORCH_CPU_GENERATOR);
    g->set_device("cpu");
    g->set_torch_version("1.13.0");
    g->set_state(std::string("\x00\x01\x02state-bytes\xff", 15) + name);
    g->set_seed(1234);
  }

  v1::Numerics* num = c.mutable_numerics();
  const char* layers[] = {"embed", "blocks.0", "blocks.1", "loss"};
  for (int i = 0; i < 4; ++i) {
    v1::LayerStats* l = num->add_layers();
    l->set_index(i);
    l->set_name(layers[i]);
    l->set_phase(i == 3 ? v1::BACKWARD : v1::FORWARD);
    FillMeta(l->mutable_meta(), v1::FLOAT32, {2, 4, 8});
    FillStats(l->mutable_stats(), 64, 2, 5);
    l->set_anomalous(i == 1);
  }
  num->set_first_anomalous_layer("blocks.0");
  num->set_first_anomalous_index(1);
  num->set_first_anomalous_phase(v1::FORWARD);
  num->set_anomaly_reason("2 NaN in forward output");
  num->set_intra_op_threads(4);
  num->set_path(v1::OPTIMIZED);

  v1::TensorBlob* ids = c.add_tensors();
  SetTensor(ids, "input_ids", v1::INT64, {2, 4}, Int64Bytes({5, 17, 3, 99, 6, 18, 4, 100}));
  ids->set_role(v1::BATCH_INPUT);
  ids->set_layer("embed");
  v1::TensorBlob* w = c.add_tensors();
  SetTensor(w, "blocks.0.attn.qkv.weight", v1::FLOAT32, {2, 3},
            FloatBytes({1.0f, -2.0f, 0.5f, 0.0f, 3.25f, -0.125f}));
  w->set_role(v1::PARAMETER);
  w->set_layer("blocks.0");
  w->mutable_meta()->set_storage_offset(2);

  v1::Placement* p = c.mutable_placement();
  p->set_rank(1);
  p->set_world_size(4);
  p->set_local_rank(1);
  p->set_data_parallel_rank(1);
  p->set_tensor_parallel_rank(1);
  p->set_pipeline_parallel_rank(1);
  p->set_device("cuda:1");

  v1::Environment* env = c.mutable_environment();
  env->set_capsule_version("0.1.0");
  env->set_torch_version("1.13.0");
  env->set_compiler("GCC 12.2.0");
  env->set_os("Linux 6.1.0");
  env->set_kernel("#1 SMP PREEMPT_DYNAMIC Debian 6.1.0");
  env->set_cpu_model("Test CPU @ 2.0GHz");
  env->add_cpu_flags("avx2");
  env->add_cpu_flags("fma");
  env->set_blas("OpenBLAS 0.3.21");
  env->set_intra_op_threads(4);
  env->set_inter_op_threads(2);
  env->set_deterministic_algorithms(true);
  (*env->mutable_libraries())["zstd"] = "1.5.4";
  (*env->mutable_libraries())["protobuf"] = "3.21.12";
  (*env->mutable_libraries())["openssl"] = "3.0.19";
  env->set_hostname("trainer-07");
  env->add_cuda_devices("NVIDIA Test GPU");
  env->set_cuda_version("12.2");
  env->set_torch_config("PyTorch built with: ...");

  v1::LogRecord* log = c.mutable_log();
  log->add_lines("step 1233 loss 7.0");
  log->add_lines("step 1234 loss 12.5");
  log->set_error("loss spike");
  log->add_backtrace("#0 capsule::Monitor::OnStep");
  log->add_backtrace("#1 main");

  v1::ModelSpec* model = c.mutable_model();
  model->set_registry_name("tiny_gpt");
  model->set_config_json("{\"d_model\": 64}");
  model->set_trainer_path(v1::OPTIMIZED);
  model->set_weight_policy(v1::WEIGHTS_ANOMALOUS_LAYER);
  for (const char* l : layers) model->add_layers(l);
  model->add_declared_frozen("embed.*");
  v1::WeightsReference* ref = model->mutable_weights_reference();
  ref->set_path("/ckpt/model.pt");
  ref->set_size_bytes(4096);
  ref->set_file_sha256(*Sha256Hex("checkpoint file"));
  ref->set_format("torch_archive");
  ref->set_tensors_sha256(*Sha256Hex("checkpoint tensors"));
  for (const char* name : {"blocks.0.attn.qkv.weight", "embed.weight", "ln_f.running_mean"}) {
    v1::TensorDigest* d = ref->add_tensors();
    d->set_name(name);
    d->set_dtype("float32");
    d->add_shape(2);
    d->add_shape(3);
    d->set_sha256(*Sha256Hex(name));
    d->set_buffer(std::string(name).find("running") != std::string::npos);
  }
  ref->set_matches_step(true);

  v1::Redaction* red = c.mutable_redaction();
  red->add_dropped("text");
  red->add_dropped("host");
  red->set_redacted_unix_micros(1700000000999999);
  red->set_source_sha256(*Sha256Hex("source capsule"));
  red->set_unknown_field_bytes_dropped(17);

  // Made from a capsule whose signer its maker trusted: readers that trust the capsule's own
  // signer accept it (a source its maker did not trust is refused, FORMAT.md §6 check 21).
  v1::Derivation* derivation = c.add_derivations();
  derivation->set_tool("redact");
  derivation->set_source_sha256(*Sha256Hex("source capsule"));
  derivation->set_source_trust(v1::TRUST_VERIFIED);
  derivation->set_source_signer_key_id(*Sha256Hex("source signer key"));
  derivation->set_derived_unix_micros(1700000000999999);

  v1::Objective* objective = c.mutable_objective();
  objective->set_reduction(v1::TOKEN_MEAN);
  objective->set_normalizer(4);
  objective->set_ranks(4);
  objective->set_ignore_index(-100);
  objective->set_kind(v1::LANGUAGE_MODEL);
  objective->set_label_smoothing(0.1);

  v1::OptimizerStep* opt = c.mutable_optimizer();
  opt->set_kind(v1::ADAMW);
  v1::ParamGroup* group = opt->add_groups();
  group->set_lr(3e-4);
  group->set_beta1(0.9);
  group->set_beta2(0.999);
  group->set_eps(1e-8);
  group->set_weight_decay(0.1);
  group->set_amsgrad(true);
  group->set_scheduled_lr(3e-4);
  group->set_maximize(true);
  v1::ParamGroup* no_decay = opt->add_groups();
  *no_decay = *group;
  no_decay->set_weight_decay(0);
  v1::ParamStep* ps = opt->add_params();
  ps->set_name("blocks.0.attn.qkv.weight");
  ps->set_group(1);
  ps->set_requires_grad(true);
  ps->set_decay_exempt(true);
  ps->set_step_before(1233);
  // Every state tensor names the one parameter blob: the rule is that names resolve.
  for (std::string* name :
       {ps->mutable_grad(), ps->mutable_exp_avg(), ps->mutable_exp_avg_sq(),
        ps->mutable_param_after(), ps->mutable_exp_avg_after(), ps->mutable_exp_avg_sq_after()}) {
    *name = "blocks.0.attn.qkv.weight";
  }
  ps->set_grad_norm(1.5);
  ps->set_param_norm(4.25);
  ps->set_update_norm(0.001);
  opt->add_order("unscale");
  opt->add_order("step");
  opt->set_clip_max_norm(1.0);
  opt->set_grad_norm_before_clip(2.5);
  opt->set_loss_scale(65536);
  opt->set_found_inf(true);
  opt->set_observed_after(true);
  opt->set_optimizer_class("torch::optim::AdamW");
  v1::RunEvent* event = c.add_events();
  event->set_step(1000);
  event->set_kind("data_mixture");
  event->set_detail("code share 10% -> 20%");

  golden::FillDistributed(c.mutable_distributed(), 1700000000000000);
  golden::FillGeneration(c.mutable_generation());

  c.add_capture_notes("data.sequences[1]: raw sample is not valid UTF-8; stored in raw_bytes");
  (*c.mutable_annotations())["experiment"] = "exp-42";
  (*c.mutable_annotations())["owner"] = "numerics";
  (*c.mutable_annotations())["a"] = "first in order";
  return c;
}

std::vector<std::string> UnsetFieldPaths(const google::protobuf::Message& message) {
  std::set<std::string> set;
  MarkSet(message, "", &set);
  std::vector<std::string> unset;
  ListUnset(message.GetDescriptor(), "", set, &unset);
  return unset;
}

Layout ParseLayout(std::string_view bytes) {
  Layout l;
  l.file_size = bytes.size();
  if (bytes.size() < 48 + 84) {
    std::cerr << "ParseLayout: " << bytes.size() << " bytes is not a capsule\n";
    std::abort();
  }
  l.header_size = LoadLe32(&bytes[12]);
  l.payload_size = LoadLe64(&bytes[24]);
  l.trailer_at = l.header_size + l.payload_size;
  if (l.trailer_at + 84 > bytes.size()) {
    std::cerr << "ParseLayout: sizes do not add up\n";
    std::abort();
  }
  l.sig_alg = LoadLe16(&bytes[l.trailer_at]);
  l.sig_size = LoadLe16(&bytes[l.trailer_at + 2]);
  if (l.trailer_at + 84 + l.sig_size != bytes.size()) {
    std::cerr << "ParseLayout: trailer does not end the file\n";
    std::abort();
  }
  return l;
}

std::string ExpectedSignedMessage(std::string_view header, std::string_view payload) {
  std::string m("capsule/sign/v1\n");
  m.append(header);
  m.append(*Sha256(payload));
  return m;
}

std::string BuildEnvelope(const RawHeader& h, std::string_view payload, const PrivateKey* key) {
  std::string header(std::max<size_t>(h.header_size, 48), '\0');
  std::memcpy(&header[0], "\211CPS\r\n\032\n", 8);
  StoreLe16(&header[8], h.major);
  StoreLe16(&header[10], h.minor);
  StoreLe32(&header[12], h.header_size);
  StoreLe32(&header[16], h.required_flags);
  StoreLe32(&header[20], h.optional_flags);
  StoreLe64(&header[24], h.payload_size.value_or(payload.size()));
  StoreLe64(&header[32], h.uncompressed_size);
  StoreLe32(&header[40], h.codec);
  StoreLe32(&header[44], h.reserved);
  if (!h.signer_key.empty()) header.replace(48, h.signer_key.size(), h.signer_key);
  if (h.header_size < 48) header.resize(48);
  std::string out = header;
  out.append(payload);
  out += Trailer(header, payload, key);
  return out;
}

std::string Reseal(std::string_view bytes, const PrivateKey* key) {
  const Layout l = ParseLayout(bytes);
  std::string header(bytes.substr(0, l.header_size));
  // A 1.1 header names its signer too (FORMAT.md §2, bit 3): a new signer replaces the key there.
  if (key != nullptr && header.size() >= 80 && (LoadLe32(&header[20]) & 8u) != 0) {
    const std::string raw = OrDie(key->GetPublicKey()).raw();
    std::memcpy(&header[48], raw.data(), raw.size());
  }
  const std::string_view payload = bytes.substr(l.header_size, l.payload_size);
  return header + std::string(payload) + Trailer(header, payload, key);
}

std::string Incompressible(size_t n) {
  std::string s(n, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x >> 56);
  }
  return s;
}

std::string SerializeDeterministic(const v1::Capsule& capsule) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  capsule.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

::testing::AssertionResult HasError(const Status& status, StatusCode code,
                                    std::string_view substring) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected " << StatusCodeName(code) << " (\"" << substring << "\"), got " << status;
  }
  if (status.message().find(substring) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "expected a message containing \"" << substring << "\", got " << status;
  }
  return ::testing::AssertionSuccess();
}

CapsuleBytesTest::CapsuleBytesTest()
    : key_(FixedKey('\x11')),
      pub_(OrDie(key_.GetPublicKey())),
      other_key_(FixedKey('\x22')),
      other_pub_(OrDie(other_key_.GetPublicKey())),
      signed_(EncodeSigned(MakeMinimalCapsule())),
      unsigned_(EncodeUnsigned(MakeMinimalCapsule())) {}

ReadOptions CapsuleBytesTest::Strict() const {
  ReadOptions o;
  o.trusted_keys.push_back(pub_);
  return o;
}

ReadOptions CapsuleBytesTest::AllowUnsigned() const {
  ReadOptions o = Strict();
  o.allow_unsigned = true;
  return o;
}

std::string CapsuleBytesTest::EncodeSigned(const v1::Capsule& capsule) const {
  WriteOptions o;
  o.signing_key = &key_;
  return OrDie(EncodeCapsule(capsule, o));
}

std::string CapsuleBytesTest::EncodeUnsigned(const v1::Capsule& capsule) const {
  return OrDie(EncodeCapsule(capsule, WriteOptions()));
}

std::string CapsuleBytesTest::FlipByte(std::string bytes, size_t offset, uint8_t mask) {
  bytes.at(offset) = static_cast<char>(static_cast<uint8_t>(bytes.at(offset)) ^ mask);
  return bytes;
}

std::string CapsuleBytesTest::TruncateTo(std::string bytes, size_t n) {
  bytes.resize(std::min(n, bytes.size()));
  return bytes;
}

const PrivateKey* CapsuleBytesTest::SignerOf(std::string_view bytes) const {
  const Layout l = ParseLayout(bytes);
  if (l.sig_alg == 0) return nullptr;
  const std::string_view key_id = bytes.substr(l.key_id_at(), 32);
  return key_id == other_pub_.KeyId() ? &other_key_ : &key_;
}

std::string CapsuleBytesTest::EditHeader(std::string bytes,
                                         const std::function<void(char*)>& edit) const {
  // The layout and signer are read before the edit: it may change the size fields.
  const PrivateKey* signer = SignerOf(bytes);
  const Layout l = ParseLayout(bytes);
  std::string header = bytes.substr(0, l.header_size);
  edit(header.data());
  const std::string payload = bytes.substr(l.header_size, l.payload_size);
  return header + payload + Trailer(header, payload, signer);
}

std::string CapsuleBytesTest::SetHeader32(std::string bytes, size_t offset, uint32_t value) const {
  return EditHeader(std::move(bytes), [&](char* h) { StoreLe32(h + offset, value); });
}

std::string CapsuleBytesTest::SetHeader64(std::string bytes, size_t offset, uint64_t value) const {
  return EditHeader(std::move(bytes), [&](char* h) { StoreLe64(h + offset, value); });
}

std::string CapsuleBytesTest::SetRequiredFlag(std::string bytes, uint32_t bit) const {
  return EditHeader(std::move(bytes), [&](char* h) { StoreLe32(h + 16, LoadLe32(h + 16) | bit); });
}

std::string CapsuleBytesTest::SetMajor(std::string bytes, uint16_t major) const {
  return EditHeader(std::move(bytes), [&](char* h) { StoreLe16(h + 8, major); });
}

std::string CapsuleBytesTest::ResignWith(std::string_view bytes, const PrivateKey& key) {
  return Reseal(bytes, &key);
}

}  // namespace capsule::test
