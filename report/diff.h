// Comparing two capsules: DiffCapsules returns what differs between them in identity, environment,
// config, trigger and per-layer stats, as data ({section, key, a, b}); RenderDiffTable and
// RenderDiffJson print that list. Answers "what changed between the run that failed and the one
// that did not" without reading two inspect dumps side by side.
//
//   std::vector<capsule::CapsuleDifference> d = capsule::DiffCapsules(*a.capsule, *b.capsule);
//   std::cout << capsule::RenderDiffTable(d);
//   return d.empty() ? 0 : 1;
//
// Ignored on purpose: timestamps (created_unix_micros, trigger wall time, redaction time), which
// differ between any two captures, and the host name, so a capsule and its host-redacted copy
// compare equivalent; the envelope (signature, signer) is not content either.
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_REPORT_DIFF_H_
#define CAPSULE_REPORT_DIFF_H_

#include <string>
#include <vector>

#include "capsule/format/capsule_fwd.h"

namespace capsule::v1 {
class InputTrust;
}  // namespace capsule::v1

namespace capsule {

struct CapsuleDifference {
  std::string section;  // "identity", "environment", "config", "trigger", "layers"
  std::string key;      // e.g. "model_sha256", "libraries.zstd", "blocks.0/forward absmax"
  std::string a;        // the value in the first capsule; "-" when absent
  std::string b;        // the value in the second capsule; "-" when absent
  std::string note;     // e.g. the relative change "+25%", or where config texts first differ
};

// Empty when the capsules are equivalent in every compared section. Stable order: sections in the
// order above, fields in schema order, layers in A's order then B-only layers.
std::vector<CapsuleDifference> DiffCapsules(const v1::Capsule& a, const v1::Capsule& b);

// Rows the renderers show at most; the rest are counted ("… 299,800 more differences").
inline constexpr size_t kMaxDiffTableRows = 200;
inline constexpr size_t kMaxDiffJsonRows = 10000;

// A table with columns SECTION KEY A B NOTE, or "equivalent" when `diff` is empty. Each cell is
// cut to 64 bytes and made Printable (base/internal/printable.h), so untrusted text can neither
// move the cursor nor reorder the line.
std::string RenderDiffTable(const std::vector<CapsuleDifference>& diff);
// A capsule.v1.CapsuleDiff (proto/report.proto) in protobuf's JSON mapping:
// {"equivalent":bool,"differences":[{"section","key","a","b","note"}...]}, with how far each
// capsule was trusted ("a_trust", "b_trust") when given (not owned).
std::string RenderDiffJson(const std::vector<CapsuleDifference>& diff,
                           const v1::InputTrust* a = nullptr, const v1::InputTrust* b = nullptr);

}  // namespace capsule

#endif  // CAPSULE_REPORT_DIFF_H_
