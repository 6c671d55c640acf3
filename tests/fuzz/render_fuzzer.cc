// The renderers' fuzz target: whatever capsule the reader accepts (an input taken as a serialized
// message, or as a capsule file re-sealed under a fresh digest) rendered by every human-facing
// printer: `capsule inspect`'s summary, the Markdown, HTML and JSON reports, and the diff table
// and JSON against a minimal capsule. Invariants, each abort()ing when broken:
// - no raw control character (C0 but line breaks and tabs, DEL, C1) and no
//   bidirectional control reaches the inspect summary, the Markdown report or the diff table;
// - the Markdown report fits a GitHub issue body (65,536 characters);
// - every report stays within 4 MiB, whatever the capsule holds (the reader allows 1 MiB here);
// - the JSON report and diff parse back as their messages.
#include <google/protobuf/util/json_util.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "capsule/base/internal/printable.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/envelope_format.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/report.pb.h"
#include "capsule/report/diff.h"
#include "capsule/report/inspect_text.h"
#include "capsule/report/report.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
namespace {

// The line of `text` around byte `at`, escaped: what a finding reports.
std::string LineAround(const std::string& text, size_t at) {
  const size_t from = text.rfind('\n', at);
  const size_t to = text.find('\n', at);
  const size_t begin = from == std::string::npos ? 0 : from + 1;
  return Printable(text.substr(begin, to == std::string::npos ? std::string::npos : to - begin));
}

// Fails when `text` holds a byte sequence a terminal would act on.
void CheckTerminalSafe(const std::string& text, const char* what) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    // Line breaks and tabs are our own layout (Printable's kKeep passes them too); a tab moves
    // the cursor forward only, so it cannot overwrite or forge anything.
    if ((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f) {
      Fail(what, InternalError("raw C0 control in: " + LineAround(text, i)));
    }
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if (ch == 0xC2 && next >= 0x80 && next <= 0x9F) Fail(what, InternalError("raw C1 control"));
    if (ch == 0xE2 && i + 2 < text.size()) {
      const auto third = static_cast<unsigned char>(text[i + 2]);
      const bool bidi =
          (next == 0x80 && (third == 0x8E || third == 0x8F || (third >= 0xAA && third <= 0xAE) ||
                            third == 0xA8 || third == 0xA9)) ||
          (next == 0x81 && third >= 0xA6 && third <= 0xA9);
      if (bidi) Fail(what, InternalError("raw bidirectional control"));
    }
  }
}

template <typename Message>
void CheckJson(const std::string& json, const char* what) {
  Message m;
  if (!google::protobuf::util::JsonStringToMessage(json, &m).ok()) {
    Fail(what, InternalError("does not parse back"));
  }
}

void Render(const DecodedCapsule& d) {
  constexpr size_t kMaxReport = size_t{4} << 20;
  CheckTerminalSafe(RenderInspectSummary("fuzz\x1b[2K.capsule", d), "inspect summary");
  ReportOptions options;
  options.file_name = "dir/fuzz\u202e.capsule";
  const ReportModel m = BuildReportModel(*d.capsule, d.envelope, nullptr, options);
  const std::string md = RenderMarkdown(m);
  CheckTerminalSafe(md, "Markdown report");
  size_t chars = 0;
  for (const char ch : md) chars += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  if (chars > options.limits.markdown_chars) Fail("Markdown report", InternalError("too long"));
  const std::string html = RenderHtml(m);
  if (html.size() > kMaxReport) Fail("HTML report", InternalError("too long"));
  const std::string json = RenderJson(m);
  if (json.size() > kMaxReport) Fail("JSON report", InternalError("too long"));
  CheckJson<v1::CapsuleReport>(json, "JSON report");

  v1::Capsule minimal;
  minimal.set_writer_version("0.1.0");
  const std::vector<CapsuleDifference> diff = DiffCapsules(*d.capsule, minimal);
  const std::string table = RenderDiffTable(diff);
  CheckTerminalSafe(table, "diff table");
  if (table.size() > kMaxReport) Fail("diff table", InternalError("too long"));
  CheckJson<v1::CapsuleDiff>(RenderDiffJson(diff), "diff JSON");
}

void TestOneInput(std::string_view bytes) {
  QuietProtobuf();
  if (std::optional<DecodedCapsule> d = DecodeFuzzInput(bytes)) Render(*d);
}

}  // namespace
}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  capsule::fuzz::TestOneInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
