#include "capsule/format/validate.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/derivation.h"
#include "capsule/format/dtype.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

Status Invalid(const std::string& where, const std::string& what) {
  return InvalidArgumentError(where + ": " + what);
}

std::string ShapeString(const v1::TensorMeta& meta) {
  std::string s = DTypeName(meta.dtype()) + "[";
  for (int i = 0; i < meta.shape_size(); ++i) {
    if (i) s += ",";
    s += std::to_string(meta.shape(i));
  }
  return s + "]";
}

// Bound on every element count and position a TensorMeta implies: 2^36 elements is 256 GiB of
// float32, beyond what one device holds, and keeps every sum below from overflowing.
constexpr int64_t kMaxElements = int64_t{1} << 36;

Status ValidateMeta(const std::string& where, const v1::TensorMeta& meta, int64_t* numel) {
  if (meta.dtype() == v1::DTYPE_UNSPECIFIED) return Invalid(where, "dtype is unspecified");
  if (DTypeElementSize(meta.dtype()) == 0) {
    return Invalid(where, "dtype " + std::to_string(meta.dtype()) + " is unknown");
  }
  if (meta.strides_size() != 0 && meta.strides_size() != meta.shape_size()) {
    return Invalid(where, "strides and shape have different ranks");
  }
  int64_t n = 1;
  for (int64_t d : meta.shape()) {
    if (d < 0) return Invalid(where, "negative dimension in shape");
    if (d != 0 && n > kMaxElements / d) return Invalid(where, "shape is too large");
    n *= d;
  }
  if (meta.storage_offset() < 0) return Invalid(where, "negative storage offset");
  if (meta.storage_offset() >= kMaxElements) {
    return Invalid(where, "storage offset " + std::to_string(meta.storage_offset()) +
                              " is beyond any storage (at most 2^36 elements)");
  }
  // The last element the strides address, offset + sum((shape[i] - 1) * stride[i]), must lie
  // inside a storage of at most 2^36 elements. Each product is compared before it is formed.
  int64_t last = meta.storage_offset();
  for (int i = 0; i < meta.strides_size(); ++i) {
    const int64_t stride = meta.strides(i);
    if (stride < 0) return Invalid(where, "negative stride");
    if (stride > kMaxElements) {
      return Invalid(where, "stride " + std::to_string(stride) +
                                " is beyond any storage (at most 2^36 elements)");
    }
    const int64_t steps = n == 0 ? 0 : meta.shape(i) - 1;  // an empty tensor addresses nothing
    if (steps > 0 && stride > (kMaxElements - 1 - last) / steps) {
      return Invalid(where,
                     "strides and storage offset address elements beyond any storage (at most "
                     "2^36 elements)");
    }
    last += steps * stride;
  }
  *numel = n;
  return Status::Ok();
}

Status ValidateStats(const std::string& where, const v1::HealthStats& s) {
  const int64_t counts[] = {s.nan_count(), s.pos_inf_count(), s.neg_inf_count(), s.zero_count()};
  if (s.numel() < 0) return Invalid(where, "negative numel");
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0 || c > s.numel()) return Invalid(where, "a count is outside [0, numel]");
    // Compared before adding: four counts near INT64_MAX would overflow the sum (undefined
    // behaviour) and could wrap around to a total that looks within numel.
    if (c > s.numel() - total) return Invalid(where, "counts add up to more than numel");
    total += c;
  }
  const int64_t nonfinite = s.nan_count() + s.pos_inf_count() + s.neg_inf_count();
  const int64_t first = s.first_nonfinite_index();
  if (first != -1 && (first < 0 || first >= s.numel())) {
    return Invalid(where, "first_nonfinite_index is outside [-1, numel)");
  }
  if ((nonfinite == 0) != (s.first_nonfinite_index() == -1)) {
    return Invalid(where, "first_nonfinite_index disagrees with the non-finite counts");
  }
  return Status::Ok();
}

// proto3 parsing rejects a string field that is not UTF-8, but serializing one succeeds: without
// this check a writer could write a capsule no reader can open (raw sample text, log lines and
// host names come from outside). Returns false and the field's path at the first bad string.
bool StringsAreUtf8(const google::protobuf::Message& m, std::string* where) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  std::string scratch;
  for (const FieldDescriptor* f : fields) {
    const bool is_string = f->type() == FieldDescriptor::TYPE_STRING;
    if (!is_string && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      std::string inner;
      bool ok;
      if (is_string) {
        ok = IsUtf8(f->is_repeated() ? r->GetRepeatedStringReference(m, f, i, &scratch)
                                     : r->GetStringReference(m, f, &scratch));
      } else {
        ok = StringsAreUtf8(f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f),
                            &inner);
      }
      if (!ok) {
        *where = f->name() + (f->is_repeated() ? "[" + std::to_string(i) + "]" : "") +
                 (inner.empty() ? "" : "." + inner);
        return false;
      }
    }
  }
  return true;
}

// MakeStringsUtf8's walk: fixes every invalid string under `m`, naming each from `prefix`.
void FixStrings(google::protobuf::Message* m, const std::string& prefix,
                std::vector<std::string>* notes) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const FieldDescriptor* f : fields) {
    const bool is_string = f->type() == FieldDescriptor::TYPE_STRING;
    if (!is_string && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const int n = f->is_repeated() ? r->FieldSize(*m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string where =
          prefix + f->name() + (f->is_repeated() ? "[" + std::to_string(i) + "]" : "");
      if (!is_string) {
        FixStrings(f->is_repeated() ? r->MutableRepeatedMessage(m, f, i) : r->MutableMessage(m, f),
                   where + ".", notes);
        continue;
      }
      const std::string value =
          f->is_repeated() ? r->GetRepeatedString(*m, f, i) : r->GetString(*m, f);
      if (IsUtf8(value)) continue;
      std::string fixed = EscapeInvalidUtf8(value);
      size_t escapes = 0;
      for (size_t at = fixed.find("\\x"); at != std::string::npos; at = fixed.find("\\x", at + 1)) {
        ++escapes;
      }
      notes->push_back(where + ": not valid UTF-8; " + std::to_string(escapes) +
                       (escapes == 1 ? " byte" : " bytes") + " stored as \\xNN escapes");
      if (f->is_repeated()) {
        r->SetRepeatedString(m, f, i, std::move(fixed));
      } else {
        r->SetString(m, f, std::move(fixed));
      }
    }
  }
}

// Every enum field (and repeated enum element) holds a value capsule.proto defines. proto3 enums
// are open: parsing keeps 99 in trigger.kind, and each consumer would meet it in a switch.
// Returns false and the field's path at the first unknown value.
bool EnumsAreKnown(const google::protobuf::Message& m, std::string* where) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const bool is_enum = f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM;
    if (!is_enum && f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string at = f->name() + (f->is_repeated() ? "[" + std::to_string(i) + "]" : "");
      if (is_enum) {
        const int v = f->is_repeated() ? r->GetRepeatedEnumValue(m, f, i) : r->GetEnumValue(m, f);
        if (f->enum_type()->FindValueByNumber(v) == nullptr) {
          *where = at + ": " + std::to_string(v) + " is not a known " + f->enum_type()->name() +
                   " value";
          return false;
        }
        continue;
      }
      std::string inner;
      if (!EnumsAreKnown(f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f),
                         &inner)) {
        *where = at + "." + inner;
        return false;
      }
    }
  }
  return true;
}

// Timestamps in microseconds since the epoch: before 2000 or from 2200 on is no capture time
// (a clock read as seconds or nanoseconds, INT64_MIN/MAX, or garbage).
constexpr int64_t kMinUnixMicros = int64_t{946684800} * 1000000;   // 2000-01-01T00:00:00Z
constexpr int64_t kMaxUnixMicros = int64_t{7258118400} * 1000000;  // 2200-01-01T00:00:00Z
bool IsSaneTime(int64_t micros) { return micros >= kMinUnixMicros && micros < kMaxUnixMicros; }
constexpr const char kTimeRange[] = "between 2000-01-01 and 2200-01-01 (microseconds since 1970)";

// How deeply the objects and arrays of JSON text nest, brackets inside strings not counted. It
// reads no further than `limit` + 1 levels need: a deeper text is refused before anything parses
// it.
int JsonDepth(std::string_view json, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char ch = json[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  return deepest;
}

// What replay and triage size their work by (FORMAT.md §6.2): threads, ranks, the model config.
Status ValidateBounds(const v1::Capsule& c) {
  const std::pair<const char*, int> threads[] = {
      {"environment.intra_op_threads", c.environment().intra_op_threads()},
      {"environment.inter_op_threads", c.environment().inter_op_threads()},
      {"numerics.intra_op_threads", c.numerics().intra_op_threads()}};
  for (const auto& [where, n] : threads) {
    if (n < 0 || n > kMaxThreads) {
      return Invalid(
          where, "must be in [0, " + std::to_string(kMaxThreads) + "], not " + std::to_string(n));
    }
  }
  const v1::Placement& p = c.placement();
  if (p.world_size() > kMaxWorldSize) {
    return Invalid("placement.world_size", "must be at most " + std::to_string(kMaxWorldSize) +
                                               ", not " + std::to_string(p.world_size()));
  }
  // World size 0 is "not known": the rank is then bounded by the largest world size.
  const int bound = p.world_size() > 0 ? p.world_size() : kMaxWorldSize;
  if (p.rank() < 0 || p.world_size() < 0 || p.rank() >= bound) {
    return Invalid("placement", "rank must be in [0, world_size) (below " +
                                    std::to_string(kMaxWorldSize) + " when world_size is 0)");
  }
  const std::string& config = c.model().config_json();
  if (config.size() > kMaxModelConfigBytes) {
    return Invalid("model.config_json", "is " + std::to_string(config.size()) + " bytes; at most " +
                                            std::to_string(kMaxModelConfigBytes) + " are read");
  }
  if (JsonDepth(config, kMaxModelConfigDepth) > kMaxModelConfigDepth) {
    return Invalid("model.config_json", "nests objects and arrays more than " +
                                            std::to_string(kMaxModelConfigDepth) + " deep");
  }
  return Status::Ok();
}

// Capsule.generation: counts and probabilities in range, hashes well formed.
Status ValidateGeneration(const v1::Capsule& c) {
  const v1::Generation& g = c.generation();
  if (g.prompt_length() < 0 || g.prefill_chunk() < 0) {
    return Invalid("generation", "prompt_length and prefill_chunk must be >= 0");
  }
  const v1::Sampling& s = g.sampling();
  if (!(std::isfinite(s.temperature()) && s.temperature() >= 0) || s.top_k() < 0 ||
      !(s.top_p() >= 0 && s.top_p() <= 1)) {
    return Invalid("generation.sampling",
                   "temperature must be finite and >= 0, top_k >= 0 and top_p in [0, 1]");
  }
  if (!(std::isfinite(g.cache().quant_scale()) && g.cache().quant_scale() >= 0)) {
    return Invalid("generation.cache.quant_scale", "must be finite and >= 0");
  }
  if (g.adapter_rank() < 0) return Invalid("generation.adapter_rank", "must be >= 0");
  if (!std::isfinite(g.adapter_alpha())) {
    return Invalid("generation.adapter_alpha", "must be finite");
  }
  for (const auto& [where, hash] : {std::pair<const char*, const std::string*>{
                                        "generation.tokenizer_sha256", &g.tokenizer_sha256()},
                                    {"generation.template_sha256", &g.template_sha256()},
                                    {"generation.adapter_sha256", &g.adapter_sha256()}}) {
    if (!hash->empty() && !IsSha256Hex(*hash)) {
      return Invalid(where, "must be empty or 64 lowercase hex characters");
    }
  }
  return Status::Ok();
}

// Capsule.derivations (FORMAT.md §3.1): what a reader holds the capsule's trust to, so every entry
// must say it plainly.
Status ValidateDerivations(const v1::Capsule& c) {
  if (c.derivations_size() > kMaxDerivations) {
    return Invalid("derivations", "must hold at most " + std::to_string(kMaxDerivations) +
                                      " entries, not " + std::to_string(c.derivations_size()));
  }
  for (int i = 0; i < c.derivations_size(); ++i) {
    const v1::Derivation& d = c.derivations(i);
    const std::string where = "derivations[" + std::to_string(i) + "]";
    if (!IsDerivationToolName(d.tool())) {
      return Invalid(where + ".tool", "must be 1 to 32 characters of a-z, 0-9, '-' and '_'");
    }
    if (!IsSha256Hex(d.source_sha256())) {
      return Invalid(where + ".source_sha256", "must be 64 lowercase hex characters");
    }
    if (d.source_trust() == v1::TRUST_UNSPECIFIED) {
      return Invalid(where + ".source_trust", "must be set");
    }
    if (d.source_trust() == v1::TRUST_UNSIGNED ? !d.source_signer_key_id().empty()
                                               : !IsSha256Hex(d.source_signer_key_id())) {
      return Invalid(where + ".source_signer_key_id",
                     "must be 64 lowercase hex characters, and empty for an unsigned source");
    }
    if (d.derived_unix_micros() != 0 && !IsSaneTime(d.derived_unix_micros())) {
      return Invalid(where + ".derived_unix_micros",
                     std::string("must be 0 (unset) or a time ") + kTimeRange);
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckTensorDataViews(const v1::Capsule& c, const TensorDataViews* views) {
  if (views == nullptr) return Status::Ok();
  if (views->size() != static_cast<size_t>(c.tensors_size())) {
    return InvalidArgumentError("tensor data views: " + std::to_string(views->size()) +
                                " given for " + std::to_string(c.tensors_size()) + " tensors");
  }
  for (int i = 0; i < c.tensors_size(); ++i) {
    if (!(*views)[i].empty() && !c.tensors(i).data().empty()) {
      return Invalid("tensors[" + std::to_string(i) + "] (" + c.tensors(i).name() + ")",
                     "data is both in the message and held outside it");
    }
  }
  return Status::Ok();
}

std::vector<std::string> MakeStringsUtf8(v1::Capsule* capsule) {
  std::vector<std::string> notes;
  FixStrings(capsule, "", &notes);
  return notes;
}

namespace {

// Objective, optimizer step and run events (FORMAT.md §6.2).
Status ValidateObjectiveAndOptimizer(const v1::Capsule& c,
                                     const std::set<std::string>& tensor_names) {
  const v1::Objective& obj = c.objective();
  if (!std::isfinite(obj.normalizer()) || obj.normalizer() < 0) {
    return Invalid("objective.normalizer", "must be finite and >= 0");
  }
  if (obj.ranks() < 0) return Invalid("objective.ranks", "must be >= 0");
  if (!(obj.label_smoothing() >= 0 && obj.label_smoothing() <= 1)) {
    return Invalid("objective.label_smoothing", "must be in [0, 1]");
  }
  const v1::OptimizerStep& opt = c.optimizer();
  for (int i = 0; i < opt.groups_size(); ++i) {
    const v1::ParamGroup& g = opt.groups(i);
    const std::string where = "optimizer.groups[" + std::to_string(i) + "]";
    if (!std::isfinite(g.lr()) || g.lr() < 0) return Invalid(where, "lr must be finite and >= 0");
    // Another optimizer records its learning rates only (OptimizerKind OTHER_OPTIMIZER).
    if (opt.kind() != v1::ADAMW && opt.kind() != v1::ADAM) continue;
    if (!(g.beta1() >= 0 && g.beta1() < 1) || !(g.beta2() >= 0 && g.beta2() < 1)) {
      return Invalid(where, "betas must be in [0, 1)");
    }
    if (!(g.eps() > 0) || !std::isfinite(g.eps())) return Invalid(where, "eps must be > 0");
    if (!(g.weight_decay() >= 0) || !std::isfinite(g.weight_decay())) {
      return Invalid(where, "weight_decay must be finite and >= 0");
    }
  }
  std::set<std::string> names;
  for (int i = 0; i < opt.params_size(); ++i) {
    const v1::ParamStep& p = opt.params(i);
    const std::string where = "optimizer.params[" + std::to_string(i) + "] (" + p.name() + ")";
    if (p.name().empty()) return Invalid(where, "name must be set");
    if (!names.insert(p.name()).second) return Invalid(where, "duplicate name");
    if (p.group() < -1 || p.group() >= opt.groups_size()) {
      return Invalid(where, "group must be -1 or an index of optimizer.groups");
    }
    if (p.step_before() < 0) return Invalid(where, "step_before must be >= 0");
    for (const std::string* t : {&p.grad(), &p.exp_avg(), &p.exp_avg_sq(), &p.param_after(),
                                 &p.exp_avg_after(), &p.exp_avg_sq_after()}) {
      if (!t->empty() && tensor_names.count(*t) == 0) {
        return Invalid(where, "names no tensor in tensors (" + *t + ")");
      }
    }
  }
  for (int i = 0; i < c.events_size(); ++i) {
    const v1::RunEvent& e = c.events(i);
    const std::string where = "events[" + std::to_string(i) + "]";
    if (e.step() < 0 || e.kind().empty()) return Invalid(where, "step must be >= 0 and kind set");
    if (i > 0 && e.step() < c.events(i - 1).step()) {
      return Invalid(where, "steps must not decrease");
    }
  }
  return Status::Ok();
}

bool IsHex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char ch : s) {
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

// Distributed section (FORMAT.md §6.2): what `capsule triage` aligns ranks by must be ordered.
Status ValidateDistributed(const v1::Capsule& c) {
  if (!c.has_distributed()) return Status::Ok();
  const v1::Distributed& d = c.distributed();
  const int world = c.placement().world_size();
  if (d.run_id().empty() || d.run_id().size() > 128) {
    return Invalid("distributed.run_id", "must be 1 to 128 printable ASCII characters");
  }
  for (char ch : d.run_id()) {
    if (ch < 0x21 || ch > 0x7e) {
      return Invalid("distributed.run_id", "must be 1 to 128 printable ASCII characters");
    }
  }
  if (d.last_step() < 0) return Invalid("distributed.last_step", "must be >= 0");
  if (!(d.watchdog_seconds() >= 0) || !std::isfinite(d.watchdog_seconds()) ||
      !(d.timeout_seconds() >= 0) || !std::isfinite(d.timeout_seconds())) {
    return Invalid("distributed", "watchdog_seconds and timeout_seconds must be finite and >= 0");
  }
  auto rank_ok = [world](int64_t r) { return r >= 0 && (world <= 0 || r < world); };
  auto entry_ok = [&](const v1::Collective& k, const std::string& where) -> Status {
    if (k.op().empty()) return Invalid(where, "op must be set");
    if (k.state() == v1::COLLECTIVE_STATE_UNSPECIFIED) return Invalid(where, "state must be set");
    if (k.numel() < 0 || k.step() < 0) return Invalid(where, "numel and step must be >= 0");
    for (int32_t r : k.ranks()) {
      if (!rank_ok(r)) return Invalid(where, "ranks must be in [0, world_size)");
    }
    for (const auto* shapes : {&k.in_shapes(), &k.out_shapes()}) {
      for (const v1::CollectiveShape& shape : *shapes) {
        for (int64_t dim : shape.dims()) {
          if (dim < 0) return Invalid(where, "negative dimension in a shape");
        }
      }
    }
    return Status::Ok();
  };
  for (int i = 0; i < d.collectives_size(); ++i) {
    const v1::Collective& k = d.collectives(i);
    const std::string where = "distributed.collectives[" + std::to_string(i) + "]";
    if (i > 0 && k.sequence() <= d.collectives(i - 1).sequence()) {
      return Invalid(where, "sequence numbers must increase");
    }
    if (Status st = entry_ok(k, where); !st.ok()) return st;
  }
  for (int i = 0; i < d.point_to_point_size(); ++i) {
    const v1::Collective& k = d.point_to_point(i);
    const std::string where = "distributed.point_to_point[" + std::to_string(i) + "]";
    if (!rank_ok(k.peer())) return Invalid(where, "peer must be in [0, world_size)");
    if (Status st = entry_ok(k, where); !st.ok()) return st;
  }
  for (const v1::FinishedRank& f : d.finished()) {
    if (!rank_ok(f.rank()) || f.last_step() < 0) {
      return Invalid("distributed.finished", "rank must be in [0, world_size), last_step >= 0");
    }
  }
  for (int i = 0; i < d.reductions_size(); ++i) {
    const v1::GradReduction& g = d.reductions(i);
    const std::string where = "distributed.reductions[" + std::to_string(i) + "]";
    if (g.step() < 0 || g.local_non_finite() < 0 || g.global_non_finite() < 0) {
      return Invalid(where, "step and non-finite counts must be >= 0");
    }
    if (i > 0 && g.step() < d.reductions(i - 1).step()) {
      return Invalid(where, "steps must not decrease");
    }
    if (!(g.divisor() >= 0) || !std::isfinite(g.divisor())) {
      return Invalid(where, "divisor must be finite and >= 0");
    }
    if (g.rank_local_norms_size() != g.rank_local_non_finite_size() ||
        (world > 0 && g.rank_local_norms_size() > world)) {
      return Invalid(where,
                     "rank_local_norms and rank_local_non_finite must have one entry per "
                     "rank");
    }
  }
  for (int i = 0; i < d.fingerprints_size(); ++i) {
    const v1::StepFingerprint& f = d.fingerprints(i);
    const std::string where = "distributed.fingerprints[" + std::to_string(i) + "]";
    if (f.step() < 0) return Invalid(where, "step must be >= 0");
    if (i > 0 && f.step() <= d.fingerprints(i - 1).step()) {
      return Invalid(where, "steps must increase");
    }
    for (const std::string* h :
         {&f.params(), &f.replicated_rng(), &f.local_rng(), &f.sample_ids()}) {
      if (!h->empty() && !IsHex16(*h)) return Invalid(where, "checksums must be 16 lowercase hex");
    }
  }
  const v1::TriggerAgreement& a = d.agreement();
  if (a.step() < 0) return Invalid("distributed.agreement", "step must be >= 0");
  for (const v1::RankTrigger& t : a.fired()) {
    if (!rank_ok(t.rank()) || t.kind() == v1::TRIGGER_KIND_UNSPECIFIED) {
      return Invalid("distributed.agreement.fired", "rank must be in [0, world_size), kind set");
    }
  }
  for (int32_t r : a.missing_ranks()) {
    if (!rank_ok(r)) return Invalid("distributed.agreement.missing_ranks", "rank out of range");
  }
  for (const v1::ThreadPosition& t : d.threads()) {
    if (!(t.seconds() >= 0) || !std::isfinite(t.seconds())) {
      return Invalid("distributed.threads", "seconds must be finite and >= 0");
    }
  }
  return Status::Ok();
}

// The writer, the times, the derivations, the trigger and the step.
Status ValidateHeadline(const v1::Capsule& c) {
  if (c.writer_version().empty()) return Invalid("writer_version", "must be set");
  if (!IsSaneTime(c.created_unix_micros())) {
    return Invalid("created_unix_micros", std::string("must be a time ") + kTimeRange + ", not " +
                                              std::to_string(c.created_unix_micros()));
  }
  if (c.trigger().wall_time_unix_micros() != 0 &&
      !IsSaneTime(c.trigger().wall_time_unix_micros())) {
    return Invalid("trigger.wall_time_unix_micros",
                   std::string("must be 0 (unset) or a time ") + kTimeRange);
  }
  if (c.redaction().redacted_unix_micros() != 0 &&
      !IsSaneTime(c.redaction().redacted_unix_micros())) {
    return Invalid("redaction.redacted_unix_micros",
                   std::string("must be 0 (unset) or a time ") + kTimeRange);
  }
  CAPSULE_RETURN_IF_ERROR(ValidateDerivations(c));
  if (!c.has_trigger() || c.trigger().kind() == v1::TRIGGER_KIND_UNSPECIFIED) {
    return Invalid("trigger.kind", "must be set");
  }
  if (!c.has_step()) return Invalid("step", "must be set");
  const v1::StepInfo& step = c.step();
  if (step.global_step() < 0 || step.micro_batch() < 0 || step.tokens_seen() < 0 ||
      step.epoch() < 0) {
    return Invalid("step", "global_step, micro_batch, tokens_seen and epoch must be >= 0");
  }
  for (int i = 1; i < step.history_size(); ++i) {
    if (step.history(i).step() <= step.history(i - 1).step()) {
      return Invalid("step.history[" + std::to_string(i) + "]", "steps must increase");
    }
  }
  return Status::Ok();
}

// The recorded sequences and their masks.
Status ValidateData(const v1::Capsule& c) {
  if (c.data().micro_batches() < 0) return Invalid("data.micro_batches", "must be >= 0");
  for (int i = 0; i < c.data().sequences_size(); ++i) {
    const v1::Sequence& seq = c.data().sequences(i);
    const std::string where = "data.sequences[" + std::to_string(i) + "]";
    const int64_t n = seq.token_ids_size() > 0 ? seq.token_ids_size() : seq.token_count();
    if (seq.token_count() < 0) return Invalid(where, "negative token_count");
    if (!seq.token_ids_sha256().empty() && !IsSha256Hex(seq.token_ids_sha256())) {
      return Invalid(where, "token_ids_sha256 is not a lowercase hex SHA-256");
    }
    if (!seq.raw_text().empty() && !seq.raw_bytes().empty()) {
      return Invalid(where, "both raw_text and raw_bytes are set (at most one may be)");
    }
    if (seq.micro_batch() < 0 ||
        (i > 0 && seq.micro_batch() < c.data().sequences(i - 1).micro_batch())) {
      return Invalid(where, "micro_batch must be >= 0 and not decrease along the sequences");
    }
    if (c.data().micro_batches() > 0 && seq.micro_batch() >= c.data().micro_batches()) {
      return Invalid(where, "micro_batch must be below data.micro_batches");
    }
    if (seq.labels_size() != 0 && seq.labels_size() != n) {
      return Invalid(where, "labels and token_ids have different lengths");
    }
    for (const std::string* mask :
         {&seq.attention_mask(), &seq.loss_mask(), &seq.response_mask()}) {
      if (mask->empty()) continue;
      if (static_cast<int64_t>(mask->size()) != n) {
        return Invalid(where, "a mask and token_ids have different lengths");
      }
      for (char b : *mask) {
        if (b != 0 && b != 1) return Invalid(where, "a mask byte is not 0 or 1");
      }
    }
  }
  return Status::Ok();
}

// The identity's file digests and the config's digest over its text.
Status ValidateIdentity(const v1::Capsule& c) {
  for (int i = 0; i < c.identity().files_size(); ++i) {
    if (!IsSha256Hex(c.identity().files(i).sha256())) {
      return Invalid("identity.files[" + std::to_string(i) + "].sha256",
                     "must be 64 lowercase hex characters");
    }
    if (c.identity().files(i).size_bytes() < 0) {
      return Invalid("identity.files[" + std::to_string(i) + "]", "negative size");
    }
  }
  for (const std::string* h : {&c.identity().model_sha256(), &c.identity().config_sha256()}) {
    if (!h->empty() && !IsSha256Hex(*h)) {
      return Invalid("identity", "model_sha256/config_sha256 must be 64 lowercase hex characters");
    }
  }
  if (!c.identity().config_sha256().empty()) {
    CAPSULE_ASSIGN_OR_RETURN(const std::string config_hash, Sha256Hex(c.identity().config_text()));
    if (config_hash != c.identity().config_sha256()) {
      return Invalid("identity.config_sha256", "does not match config_text");
    }
  }
  return Status::Ok();
}

// Generator names are unique; each has a kind and a state.
Status ValidateRng(const v1::Capsule& c) {
  std::set<std::string> rng_names;
  for (int i = 0; i < c.rng().generators_size(); ++i) {
    const v1::RngBlob& g = c.rng().generators(i);
    const std::string where = "rng.generators[" + std::to_string(i) + "] (" + g.name() + ")";
    if (g.name().empty()) return Invalid(where, "name must be set");
    if (!rng_names.insert(g.name()).second) return Invalid(where, "duplicate name");
    if (g.kind() == v1::RNG_KIND_UNSPECIFIED) return Invalid(where, "kind must be set");
    if (g.state().empty()) return Invalid(where, "state must not be empty");
  }
  return Status::Ok();
}

// A weights reference names its tensors sorted, each with a digest and a dtype.
Status ValidateWeightsReference(const v1::Capsule& c) {
  if (c.model().has_weights_reference()) {
    const v1::WeightsReference& ref = c.model().weights_reference();
    const std::string where = "model.weights_reference";
    if (c.model().weight_policy() == v1::WEIGHTS_ALL) {
      return Invalid(where, "set although every weight is embedded (weight_policy WEIGHTS_ALL)");
    }
    if (ref.format() != "torch_pickle" && ref.format() != "torch_archive") {
      return Invalid(where, "format must be torch_pickle or torch_archive");
    }
    if (ref.size_bytes() < 0) return Invalid(where, "negative size_bytes");
    if (!IsSha256Hex(ref.tensors_sha256()) ||
        (!ref.file_sha256().empty() && !IsSha256Hex(ref.file_sha256()))) {
      return Invalid(where, "tensors_sha256 and file_sha256 must be 64 lowercase hex");
    }
    if (ref.tensors_size() == 0) return Invalid(where, "names no tensor");
    for (int i = 0; i < ref.tensors_size(); ++i) {
      const v1::TensorDigest& t = ref.tensors(i);
      const std::string at = where + ".tensors[" + std::to_string(i) + "]";
      if (t.name().empty() || t.dtype().empty()) return Invalid(at, "name and dtype must be set");
      if (CanonicalDTypeName(t.dtype()).empty()) {
        return Invalid(at, "dtype " + PrintableShort(t.dtype(), 32) +
                               " is not a dtype name (float32, bfloat16, int64, ...)");
      }
      if (i > 0 && t.name() <= ref.tensors(i - 1).name()) {
        return Invalid(at, "names must be sorted and unique");
      }
      if (!IsSha256Hex(t.sha256())) return Invalid(at, "sha256 must be 64 lowercase hex");
      for (int64_t d : t.shape()) {
        if (d < 0) return Invalid(at, "negative dimension");
      }
    }
  }
  return Status::Ok();
}

// Per-layer statistics, and the first anomalous layer names one of them.
Status ValidateNumerics(const v1::Capsule& c) {
  const v1::Numerics& num = c.numerics();
  for (int i = 0; i < num.layers_size(); ++i) {
    const v1::LayerStats& l = num.layers(i);
    const std::string where = "numerics.layers[" + std::to_string(i) + "] (" + l.name() + ")";
    if (l.phase() == v1::PHASE_UNSPECIFIED) return Invalid(where, "phase must be set");
    if (l.index() < 0) return Invalid(where, "negative index");
    if (l.has_meta()) {
      int64_t numel = 0;
      CAPSULE_RETURN_IF_ERROR(ValidateMeta(where + ".meta", l.meta(), &numel));
    }
    CAPSULE_RETURN_IF_ERROR(ValidateStats(where + ".stats", l.stats()));
  }
  if (num.first_anomalous_index() < -1) {
    return Invalid("numerics.first_anomalous_index", "must be >= -1");
  }
  if (num.first_anomalous_layer().empty()) {
    // -1 says "none"; 0 is what a writer that never set it leaves.
    if (num.first_anomalous_index() > 0) {
      return Invalid("numerics.first_anomalous_index",
                     "must be -1 when first_anomalous_layer is empty");
    }
  } else {
    bool found = false;
    for (const v1::LayerStats& l : num.layers()) {
      found = found ||
              (l.name() == num.first_anomalous_layer() && l.index() == num.first_anomalous_index());
    }
    if (!found) {
      return Invalid("numerics.first_anomalous_layer",
                     "names no layer in numerics.layers (" + num.first_anomalous_layer() +
                         " at index " + std::to_string(num.first_anomalous_index()) + ")");
    }
    if (num.first_anomalous_phase() == v1::PHASE_UNSPECIFIED) {
      return Invalid("numerics.first_anomalous_phase", "must be set with first_anomalous_layer");
    }
  }
  return Status::Ok();
}

// The tensors' names, metas, sizes and digests; returns their names, which data.tensor_names must
// name.
StatusOr<std::set<std::string>> ValidateTensors(const v1::Capsule& c,
                                                const ValidateOptions& options) {
  const TensorDataViews* views = options.tensor_data;
  CAPSULE_RETURN_IF_ERROR(CheckTensorDataViews(c, views));
  std::set<std::string> tensor_names;
  for (int i = 0; i < c.tensors_size(); ++i) {
    const v1::TensorBlob& t = c.tensors(i);
    const std::string where = "tensors[" + std::to_string(i) + "] (" + t.name() + ")";
    if (t.name().empty()) return Invalid(where, "name must be set");
    if (!tensor_names.insert(t.name()).second) return Invalid(where, "duplicate name");
    std::string_view data = t.data();
    if (views != nullptr && !(*views)[i].empty()) data = (*views)[i];
    int64_t numel = 0;
    CAPSULE_RETURN_IF_ERROR(ValidateMeta(where, t.meta(), &numel));
    const uint64_t expected = static_cast<uint64_t>(numel) * DTypeElementSize(t.meta().dtype());
    if (data.size() != expected) {
      return Invalid(where, "data is " + std::to_string(data.size()) + " bytes, expected " +
                                std::to_string(expected) + " for " + ShapeString(t.meta()));
    }
    if (!IsSha256Hex(t.sha256())) return Invalid(where, "sha256 must be 64 lowercase hex");
    if (options.verify_tensor_digests) {
      CAPSULE_ASSIGN_OR_RETURN(const std::string data_hash, Sha256Hex(data));
      if (data_hash != t.sha256()) return Invalid(where, "sha256 does not match data");
    }
  }
  for (int i = 0; i < c.data().tensor_names_size(); ++i) {
    if (tensor_names.count(c.data().tensor_names(i)) == 0) {
      return Invalid("data.tensor_names[" + std::to_string(i) + "]",
                     "names no tensor in tensors (" + c.data().tensor_names(i) + ")");
    }
  }
  return tensor_names;
}

// Annotation keys are set; the redaction drops only items it knows.
Status ValidateAnnotationsAndRedaction(const v1::Capsule& c) {
  for (const auto& [key, value] : c.annotations()) {
    if (key.empty()) return Invalid("annotations", "keys must not be empty");
  }
  static const std::set<std::string> kDroppable = {"text", "tokens", "paths", "host"};
  for (const std::string& d : c.redaction().dropped()) {
    if (kDroppable.count(d) == 0) return Invalid("redaction.dropped", "unknown item " + d);
  }
  return Status::Ok();
}

}  // namespace

Status ValidateCapsule(const v1::Capsule& c, const ValidateOptions& options) {
  CAPSULE_RETURN_IF_ERROR(ValidateHeadline(c));
  CAPSULE_RETURN_IF_ERROR(ValidateData(c));
  CAPSULE_RETURN_IF_ERROR(ValidateIdentity(c));
  CAPSULE_RETURN_IF_ERROR(ValidateRng(c));
  CAPSULE_RETURN_IF_ERROR(ValidateWeightsReference(c));
  CAPSULE_RETURN_IF_ERROR(ValidateNumerics(c));
  CAPSULE_ASSIGN_OR_RETURN(const std::set<std::string> tensor_names, ValidateTensors(c, options));
  CAPSULE_RETURN_IF_ERROR(ValidateObjectiveAndOptimizer(c, tensor_names));
  CAPSULE_RETURN_IF_ERROR(ValidateBounds(c));
  CAPSULE_RETURN_IF_ERROR(ValidateDistributed(c));
  CAPSULE_RETURN_IF_ERROR(ValidateGeneration(c));
  CAPSULE_RETURN_IF_ERROR(ValidateAnnotationsAndRedaction(c));
  std::string where;
  if (!EnumsAreKnown(c, &where)) return InvalidArgumentError(where);
  if (!StringsAreUtf8(c, &where)) {
    return Invalid(where, "is not valid UTF-8 (string fields must be; a reader cannot parse it)");
  }
  return Status::Ok();
}

}  // namespace capsule
