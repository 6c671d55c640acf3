#include "capsule/report/diff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/base/internal/strings.h"
#include "capsule/format/json.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/report.pb.h"
#include "capsule/report/internal/text.h"

namespace capsule {
namespace {

std::string Shown(const std::string& s) { return s.empty() ? "-" : s; }

// A long text as the diff shows it: its SHA-256, or its size when the hash cannot be computed;
// "" for no text.
std::string TextDigest(const std::string& text) {
  if (text.empty()) return "";
  StatusOr<std::string> hex = Sha256Hex(text);
  return hex.ok() ? *hex : std::to_string(text.size()) + " bytes (SHA-256 unavailable)";
}

std::string Join(const google::protobuf::RepeatedPtrField<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : " ") + s;
  return out;
}

// NaN equals NaN here: two capsules that both saw a NaN loss agree.
bool SameDouble(double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; }

std::string RelativeChange(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return "";
  if (a == 0) return b == 0 ? "" : "new non-zero";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.1f%%", 100.0 * (b - a) / std::fabs(a));
  return buf;
}

class Differ {
 public:
  explicit Differ(std::vector<CapsuleDifference>* out) : out_(out) {}

  void Str(const char* section, const std::string& key, const std::string& a, const std::string& b,
           std::string note = "") {
    if (a != b) Row(section, key, a, b, std::move(note));
  }
  // A row whatever a and b are: for a difference decided on something else than what is shown.
  void Row(const char* section, const std::string& key, const std::string& a, const std::string& b,
           std::string note = "") {
    out_->push_back({section, key, Shown(a), Shown(b), std::move(note)});
  }
  void Int(const char* section, const std::string& key, int64_t a, int64_t b) {
    if (a != b) out_->push_back({section, key, std::to_string(a), std::to_string(b), ""});
  }
  void Double(const char* section, const std::string& key, double a, double b, bool relative) {
    if (!SameDouble(a, b)) {
      out_->push_back({section, key, FormatSignificant(a, 6), FormatSignificant(b, 6),
                       relative ? RelativeChange(a, b) : ""});
    }
  }

 private:
  std::vector<CapsuleDifference>* out_;
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void DiffConfigText(const std::string& a, const std::string& b,
                    std::vector<CapsuleDifference>* out) {
  if (a == b) return;
  // A hint, not a full diff: the first few lines that differ position by position.
  const std::vector<std::string> la = Lines(a), lb = Lines(b);
  const size_t n = std::max(la.size(), lb.size());
  int shown = 0;
  constexpr int kMaxLines = 5;
  for (size_t i = 0; i < n && shown < kMaxLines; ++i) {
    const std::string x = i < la.size() ? la[i] : "";
    const std::string y = i < lb.size() ? lb[i] : "";
    if (i < la.size() && i < lb.size() && x == y) continue;
    out->push_back({"identity", "config_text line " + std::to_string(i + 1),
                    i < la.size() ? Shown(x) : "-", i < lb.size() ? Shown(y) : "-",
                    shown == 0
                        ? std::to_string(la.size()) + " vs " + std::to_string(lb.size()) + " lines"
                        : ""});
    ++shown;
  }
}

void DiffIdentity(const v1::Capsule& a, const v1::Capsule& b, Differ& d,
                  std::vector<CapsuleDifference>* out) {
  const v1::Identity& x = a.identity();
  const v1::Identity& y = b.identity();
  d.Str("identity", "model_sha256", x.model_sha256(), y.model_sha256());
  d.Int("identity", "model_parameter_count", x.model_parameter_count(), y.model_parameter_count());
  // Files are matched by role and name; their paths are where they happened to live, not identity.
  std::map<std::string, const v1::FileIdentity*> fa, fb;
  for (const auto& f : x.files()) fa.emplace(f.role() + ":" + f.name(), &f);
  for (const auto& f : y.files()) fb.emplace(f.role() + ":" + f.name(), &f);
  std::set<std::string> keys;
  for (const auto& [k, f] : fa) keys.insert(k);
  for (const auto& [k, f] : fb) keys.insert(k);
  for (const auto& k : keys) {
    const auto ia = fa.find(k), ib = fb.find(k);
    const std::string sa = ia == fa.end() ? "" : ia->second->sha256();
    const std::string sb = ib == fb.end() ? "" : ib->second->sha256();
    d.Str("identity", "file " + k + " sha256", sa, sb);
    if (ia != fa.end() && ib != fb.end()) {
      d.Int("identity", "file " + k + " size_bytes", ia->second->size_bytes(),
            ib->second->size_bytes());
    }
  }
  d.Str("identity", "config_sha256", x.config_sha256(), y.config_sha256());
  if (x.config_text() != y.config_text()) DiffConfigText(x.config_text(), y.config_text(), out);
  // The template text can be long: the row shows its hash. Whether it changed is decided on the
  // text itself, so a hash that cannot be computed never makes two templates equal.
  if (x.chat_template() != y.chat_template()) {
    d.Row("identity", "chat_template sha256", TextDigest(x.chat_template()),
          TextDigest(y.chat_template()));
  }
  d.Str("identity", "code_revision", x.code_revision(), y.code_revision());
}

void DiffEnvironment(const v1::Environment& x, const v1::Environment& y, Differ& d) {
  const char* s = "environment";
  d.Str(s, "capsule_version", x.capsule_version(), y.capsule_version());
  d.Str(s, "torch_version", x.torch_version(), y.torch_version());
  d.Str(s, "compiler", x.compiler(), y.compiler());
  d.Str(s, "os", x.os(), y.os());
  d.Str(s, "kernel", x.kernel(), y.kernel());
  d.Str(s, "cpu_model", x.cpu_model(), y.cpu_model());
  d.Str(s, "cpu_flags", Join(x.cpu_flags()), Join(y.cpu_flags()));
  d.Str(s, "blas", x.blas(), y.blas());
  d.Int(s, "intra_op_threads", x.intra_op_threads(), y.intra_op_threads());
  d.Int(s, "inter_op_threads", x.inter_op_threads(), y.inter_op_threads());
  d.Str(s, "deterministic_algorithms", x.deterministic_algorithms() ? "true" : "false",
        y.deterministic_algorithms() ? "true" : "false");
  std::set<std::string> libs;
  for (const auto& [k, v] : x.libraries()) libs.insert(k);
  for (const auto& [k, v] : y.libraries()) libs.insert(k);
  for (const auto& k : libs) {
    const auto ia = x.libraries().find(k), ib = y.libraries().find(k);
    d.Str(s, "libraries." + k, ia == x.libraries().end() ? "" : ia->second,
          ib == y.libraries().end() ? "" : ib->second);
  }
  d.Str(s, "cuda_devices", Join(x.cuda_devices()), Join(y.cuda_devices()));
  d.Str(s, "cuda_version", x.cuda_version(), y.cuda_version());
  // at::show_config() is pages long: say that it differs, not how.
  if (x.torch_config() != y.torch_config()) {
    d.Str(s, "torch_config", std::to_string(x.torch_config().size()) + " chars",
          std::to_string(y.torch_config().size()) + " chars", "text differs");
  }
}

void DiffConfig(const v1::Capsule& a, const v1::Capsule& b, Differ& d) {
  const v1::ModelSpec& x = a.model();
  const v1::ModelSpec& y = b.model();
  d.Str("config", "model.registry_name", x.registry_name(), y.registry_name());
  d.Str("config", "model.config_json", x.config_json(), y.config_json());
  d.Str("config", "model.trainer_path",
        x.trainer_path() ? v1::ExecutionPath_Name(x.trainer_path()) : "",
        y.trainer_path() ? v1::ExecutionPath_Name(y.trainer_path()) : "");
  d.Str("config", "model.weight_policy",
        x.weight_policy() ? v1::WeightPolicy_Name(x.weight_policy()) : "",
        y.weight_policy() ? v1::WeightPolicy_Name(y.weight_policy()) : "");
  d.Str("config", "model.layers", Join(x.layers()), Join(y.layers()));
  d.Int("config", "numerics.intra_op_threads", a.numerics().intra_op_threads(),
        b.numerics().intra_op_threads());
}

void DiffTrigger(const v1::Capsule& a, const v1::Capsule& b, Differ& d) {
  const v1::Trigger& x = a.trigger();
  const v1::Trigger& y = b.trigger();
  d.Str("trigger", "kind", v1::TriggerKind_Name(x.kind()), v1::TriggerKind_Name(y.kind()));
  d.Double("trigger", "observed", x.observed(), y.observed(), true);
  d.Double("trigger", "threshold", x.threshold(), y.threshold(), false);
  d.Str("trigger", "rule", x.rule(), y.rule());
  d.Int("trigger", "step", a.step().global_step(), b.step().global_step());
  d.Str("trigger", "first_anomalous_layer", a.numerics().first_anomalous_layer(),
        b.numerics().first_anomalous_layer());
}

std::string LayerKey(const v1::LayerStats& l) {
  return l.name() + "/" + (l.phase() == v1::BACKWARD ? "backward" : "forward");
}

void DiffLayers(const v1::Capsule& a, const v1::Capsule& b, Differ& d,
                std::vector<CapsuleDifference>* out) {
  std::map<std::string, const v1::LayerStats*> lb;
  for (const auto& l : b.numerics().layers()) lb.emplace(LayerKey(l), &l);
  std::set<std::string> seen;
  for (const auto& l : a.numerics().layers()) {
    const std::string key = LayerKey(l);
    if (!seen.insert(key).second) continue;
    const auto it = lb.find(key);
    if (it == lb.end()) {
      out->push_back({"layers", key, "present", "-", "only in A"});
      continue;
    }
    const v1::HealthStats& x = l.stats();
    const v1::HealthStats& y = it->second->stats();
    d.Int("layers", key + " numel", x.numel(), y.numel());
    d.Int("layers", key + " nan", x.nan_count(), y.nan_count());
    d.Int("layers", key + " +inf", x.pos_inf_count(), y.pos_inf_count());
    d.Int("layers", key + " -inf", x.neg_inf_count(), y.neg_inf_count());
    d.Double("layers", key + " absmax", x.absmax(), y.absmax(), true);
    d.Double("layers", key + " rms", x.rms(), y.rms(), true);
  }
  for (const auto& l : b.numerics().layers()) {
    const std::string key = LayerKey(l);
    if (seen.insert(key).second) out->push_back({"layers", key, "-", "present", "only in B"});
  }
}

}  // namespace

std::vector<CapsuleDifference> DiffCapsules(const v1::Capsule& a, const v1::Capsule& b) {
  std::vector<CapsuleDifference> out;
  Differ d(&out);
  DiffIdentity(a, b, d, &out);
  DiffEnvironment(a.environment(), b.environment(), d);
  DiffConfig(a, b, d);
  DiffTrigger(a, b, d);
  DiffLayers(a, b, d, &out);
  return out;
}

std::string RenderDiffTable(const std::vector<CapsuleDifference>& diff) {
  if (diff.empty()) {
    return "equivalent: identity, environment, config, trigger and layer stats match "
           "(timestamps and host name are not compared)\n";
  }
  const std::string headers[5] = {"SECTION", "KEY", "A", "B", "NOTE"};
  size_t width[4] = {headers[0].size(), headers[1].size(), headers[2].size(), headers[3].size()};
  constexpr size_t kMaxCell = 64;  // long values (config lines, hashes) stay readable
  auto cell = [](const std::string& s) {
    if (s.size() <= kMaxCell) return Printable(s);
    return Printable(TruncateUtf8(s, kMaxCell - 3)) + "...";
  };
  const size_t shown = std::min(diff.size(), kMaxDiffTableRows);
  std::vector<CapsuleDifference> rows(diff.begin(), diff.begin() + shown);
  // Two long values that share a prefix differ after it: show both from a little before the
  // first byte that differs, so the difference is in view ("...-7b-hf/tokenizer.json").
  for (CapsuleDifference& r : rows) {
    if (r.a.size() <= kMaxCell && r.b.size() <= kMaxCell) continue;
    size_t at = 0;
    while (at < r.a.size() && at < r.b.size() && r.a[at] == r.b[at]) ++at;
    if (at + 16 < kMaxCell) continue;  // the difference is already in view
    size_t from = at - 16;
    // Start on a character boundary of both (they agree up to `at`).
    while (from > 0 && (static_cast<unsigned char>(r.a[from]) & 0xC0) == 0x80) --from;
    for (std::string* v : {&r.a, &r.b}) {
      if (*v != "-") *v = "..." + v->substr(from);
    }
  }
  for (const auto& r : rows) {
    width[0] = std::max(width[0], cell(r.section).size());
    width[1] = std::max(width[1], cell(r.key).size());
    width[2] = std::max(width[2], cell(r.a).size());
    width[3] = std::max(width[3], cell(r.b).size());
  }
  std::ostringstream out;
  auto row = [&](const std::string& s, const std::string& k, const std::string& a,
                 const std::string& b, const std::string& n) {
    const std::string cols[4] = {s, k, a, b};
    std::string line;
    for (int i = 0; i < 4; ++i) line += cols[i] + std::string(width[i] - cols[i].size() + 2, ' ');
    line += n;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  };
  row(headers[0], headers[1], headers[2], headers[3], headers[4]);
  for (const auto& r : rows) row(cell(r.section), cell(r.key), cell(r.a), cell(r.b), cell(r.note));
  if (shown < diff.size()) {
    out << "\u2026 " << FormatCount(static_cast<int64_t>(diff.size() - shown))
        << " more differences (--json lists " << FormatCount(kMaxDiffJsonRows) << ")\n";
  }
  out << FormatCount(static_cast<int64_t>(diff.size()))
      << (diff.size() == 1 ? " difference" : " differences") << "\n";
  return out.str();
}

std::string RenderDiffJson(const std::vector<CapsuleDifference>& diff, const v1::InputTrust* a,
                           const v1::InputTrust* b) {
  v1::CapsuleDiff json;
  json.set_equivalent(diff.empty());
  if (a != nullptr) *json.mutable_a_trust() = *a;
  if (b != nullptr) *json.mutable_b_trust() = *b;
  const size_t shown = std::min(diff.size(), kMaxDiffJsonRows);
  if (shown < diff.size()) json.set_differences_left_out(static_cast<int64_t>(diff.size() - shown));
  for (size_t i = 0; i < shown; ++i) {
    const CapsuleDifference& r = diff[i];
    v1::Difference& d = *json.add_differences();
    d.set_section(r.section);
    d.set_key(r.key);
    d.set_a(r.a);
    d.set_b(r.b);
    d.set_note(r.note);
  }
  return MessageToJson(json) + "\n";
}

}  // namespace capsule
