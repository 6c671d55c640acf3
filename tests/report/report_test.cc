// capsule::report: golden Markdown and JSON for the full golden capsule, HTML structure (self-
// contained, one bar per forward layer, one point per step), the replay's triage stages,
// escaping of hostile capsule and replay text, --redact, the unsigned-capsule warning, and capsule
// diffs.
//
// CAPSULE_UPDATE_GOLDEN=1 rewrites tests/report/golden/ after an intended change.
#include "capsule/report/report.h"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/redact.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/proto/report.pb.h"
#include "capsule/report/diff.h"
#include "capsule/report/inspect_text.h"
#include "capsule/report/replay_text.h"
#include "samples/golden/golden_capsules.h"

namespace capsule {
namespace {

const std::string kSource = CAPSULE_SOURCE_DIR;
const std::string kFull = kSource + "/samples/golden/valid/full.capsule";
const std::string kMinimal = kSource + "/samples/golden/valid/minimal.capsule";
const std::string kUnsigned = kSource + "/samples/golden/valid/unsigned.capsule";
const std::string kReplayJson = kSource + "/tests/report/golden/full.replay.json";
const std::string kHostile = "<script>alert(1)</script>";

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// The text of the <svg id="ID"> element, empty when there is none.
std::string Svg(const std::string& html, const std::string& id) {
  const size_t start = html.find("<svg id=\"" + id + "\"");
  if (start == std::string::npos) return "";
  return html.substr(start, html.find("</svg>", start) - start);
}

DecodedCapsule Read(const std::string& path, bool allow_unsigned = false) {
  ReadOptions options;
  auto key = LoadPublicKeyFile(kSource + "/samples/keys/test-only.pub");
  EXPECT_TRUE(key.ok()) << key.status().message();
  options.trusted_keys.push_back(*key);
  options.allow_unsigned = allow_unsigned;
  auto d = ReadCapsuleFile(path, options);
  EXPECT_TRUE(d.ok()) << d.status().message();
  return std::move(*d);
}

std::unique_ptr<v1::ReplayReport> FixtureReplay() {
  auto text = ReadFileBytes(kReplayJson, 1 << 20);
  EXPECT_TRUE(text.ok()) << text.status().message();
  auto r = ParseReplayReportJson(*text);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(*r);
}

ReportModel FullModel(const ReportRedaction& redact = {}) {
  const DecodedCapsule d = Read(kFull);
  auto bytes = ReadFileBytes(kFull, 1 << 20);
  ReportOptions options;
  options.file_name = kFull;
  options.file_sha256 = *Sha256Hex(*bytes);
  options.redact = redact;
  const auto replay = FixtureReplay();
  return BuildReportModel(*d.capsule, d.envelope, replay.get(), options);
}

// A report of an in-memory capsule, signed state as given; no file involved.
ReportModel ModelOf(const v1::Capsule& c, SignatureState signature, const ReportOptions& options) {
  EnvelopeInfo envelope;
  envelope.signature = signature;
  return BuildReportModel(c, envelope, nullptr, options);
}

void ExpectGolden(const std::string& name, const std::string& actual) {
  const std::string path = kSource + "/tests/report/golden/" + name;
  const char* update = std::getenv("CAPSULE_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    AtomicWriteOptions replace;
    replace.overwrite = true;
    ASSERT_TRUE(WriteFileAtomic(path, actual, replace).ok());
    return;
  }
  auto expected = ReadFileBytes(path, 1 << 20);
  ASSERT_TRUE(expected.ok()) << path << ": " << expected.status().message()
                             << " (CAPSULE_UPDATE_GOLDEN=1 creates it)";
  EXPECT_EQ(*expected, actual) << "differs from " << path
                               << " (CAPSULE_UPDATE_GOLDEN=1 accepts an intended change)";
}

TEST(ReportGoldenTest, MarkdownOfFullCapsuleWithReplay) {
  ExpectGolden("full.md", RenderMarkdown(FullModel()));
}

TEST(ReportGoldenTest, JsonOfFullCapsuleWithReplay) {
  ExpectGolden("full.json", RenderJson(FullModel()));
}

TEST(ReportTest, MarkdownHasTheIssueEssentials) {
  const std::string md = RenderMarkdown(FullModel());
  EXPECT_EQ(md.rfind("## capsule report: NON_FINITE_LOSS at step 5", 0), 0u) << md;
  EXPECT_NE(md.find("diagnosis NUMERICS"), std::string::npos);
  EXPECT_NE(md.find("**← trigger**"), std::string::npos);
  EXPECT_NE(md.find("**← first anomaly**"), std::string::npos);
  EXPECT_NE(md.find("first divergence"), std::string::npos);
  EXPECT_NE(md.find("capsule verify full.capsule --pubkey SIGNER.pub"), std::string::npos);
  EXPECT_NE(md.find("capsule replay full.capsule --plugin <model plugin> --pubkey SIGNER.pub "
                    "--bisect"),
            std::string::npos);
  EXPECT_NE(md.find(*Sha256Hex(*ReadFileBytes(kFull, 1 << 20))), std::string::npos);
  EXPECT_NE(md.find("<details><summary>"), std::string::npos);
}

TEST(ReportTest, HistoryTableShowsAtMostSixteenSteps) {
  v1::Capsule c = golden::MakeFullCapsule();
  c.mutable_step()->clear_history();
  for (int i = 0; i < 40; ++i) {
    v1::StepScalars& h = *c.mutable_step()->add_history();
    h.set_step(i);
    h.set_loss(1.0 + i);
    h.set_grad_norm(2.0);
  }
  c.mutable_step()->set_global_step(39);
  const ReportModel m = ModelOf(c, SignatureState::kVerified, {});
  EXPECT_EQ(m.history.size(), 40u);
  EXPECT_EQ(m.history_table_from, 24);
  const std::string md = RenderMarkdown(m);
  EXPECT_NE(md.find("last 16 of 40 steps"), std::string::npos);
  EXPECT_EQ(md.find("| 23 |"), std::string::npos);
  EXPECT_NE(md.find("| 24 |"), std::string::npos);
  EXPECT_EQ(Count(Svg(RenderHtml(m), "chart-history"), "<circle class=\"point loss"), 40u);
}

TEST(ReportTest, LayerTableIsAWindowAroundTheFirstAnomaly) {
  v1::Capsule c = golden::MakeFullCapsule();
  v1::Numerics& n = *c.mutable_numerics();
  n.clear_layers();
  for (int i = 0; i < 30; ++i) {
    v1::LayerStats& l = *n.add_layers();
    l.set_index(i);
    l.set_name("blocks." + std::to_string(i));
    l.set_phase(v1::FORWARD);
    l.mutable_stats()->set_absmax(1.0 + i);
    l.set_anomalous(i == 10);
    if (i == 10) l.mutable_stats()->set_pos_inf_count(1);
  }
  n.set_first_anomalous_layer("blocks.10");
  n.set_first_anomalous_phase(v1::FORWARD);
  ReportModel m = ModelOf(c, SignatureState::kVerified, {});
  ASSERT_EQ(m.layer_window.size(), 7u);
  EXPECT_EQ(m.layer_window.front().name, "blocks.7");
  EXPECT_EQ(m.layer_window.back().name, "blocks.13");
  EXPECT_TRUE(m.layer_window[3].first_anomaly);

  n.clear_first_anomalous_layer();
  for (auto& l : *n.mutable_layers()) l.set_anomalous(false);
  m = ModelOf(c, SignatureState::kVerified, {});
  EXPECT_EQ(m.layer_window.size(), 20u);
  EXPECT_EQ(m.layers.size(), 30u);
}

TEST(ReportHtmlTest, IsSelfContained) {
  const std::string html = RenderHtml(FullModel());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* banned : {"http://", "https://", "<script", "<link", "@import", "url("}) {
    EXPECT_EQ(html.find(banned), std::string::npos) << banned;
  }
  EXPECT_NE(html.find("<style>"), std::string::npos);
}

TEST(ReportHtmlTest, ChartsHaveOneMarkPerLayerAndStep) {
  const ReportModel m = FullModel();
  const std::string html = RenderHtml(m);
  size_t forward = 0;
  for (const auto& l : m.layers) forward += l.phase == "forward";
  ASSERT_EQ(forward, 3u);

  const std::string absmax = Svg(html, "chart-absmax");
  EXPECT_EQ(Count(absmax, "<rect class=\"bar"), forward);
  EXPECT_EQ(Count(absmax, "<rect class=\"bar nonfinite"), 1u);  // blocks.0 holds 2 NaN

  const std::string history = Svg(html, "chart-history");
  EXPECT_EQ(Count(history, "<circle class=\"point loss"), m.history.size());
  EXPECT_EQ(Count(history, "<circle class=\"point grad-norm"), m.history.size());
  EXPECT_EQ(Count(history, "point loss nonfinite"), 1u);  // the NaN loss of step 5
  EXPECT_EQ(Count(history, "id=\"trigger-marker\""), 1u);

  const std::string divergence = Svg(html, "chart-divergence");
  EXPECT_EQ(Count(divergence, "<rect class=\"bar"), 3u);  // the fixture's forward layers
  EXPECT_EQ(Count(divergence, "first-divergent"), 1u);
  EXPECT_EQ(Count(divergence, "id=\"tolerance-line\""), 1u);
  EXPECT_NE(divergence.find("stroke-dasharray"), std::string::npos);
}

TEST(ReportHtmlTest, NoDivergenceChartWithoutReplay) {
  const DecodedCapsule d = Read(kFull);
  const std::string html = RenderHtml(BuildReportModel(*d.capsule, d.envelope, nullptr, {}));
  EXPECT_EQ(Svg(html, "chart-divergence"), "");
  EXPECT_NE(Svg(html, "chart-absmax"), "");
}

TEST(ReportEscapingTest, HostileCapsuleTextIsEscapedInEveryFormat) {
  v1::Capsule c = golden::MakeFullCapsule();
  c.set_run_name(kHostile);
  c.mutable_data()->mutable_sequences(0)->set_raw_text(kHostile + "\n```\n| x |");
  c.mutable_numerics()->mutable_layers(0)->set_name(kHostile);
  c.mutable_log()->add_lines(kHostile + "\n```");
  c.mutable_trigger()->set_message(kHostile);
  c.mutable_identity()->set_config_text("```\n" + kHostile);
  (*c.mutable_environment()->mutable_libraries())[kHostile] = kHostile;
  ReportOptions options;
  options.file_name = "dir/" + kHostile + ".capsule";
  const ReportModel m = ModelOf(c, SignatureState::kVerified, options);
  const std::string md = RenderMarkdown(m);
  const std::string html = RenderHtml(m);
  const std::string json = RenderJson(m);
  for (const std::string* out : {&md, &html, &json}) {
    EXPECT_EQ(out->find("<script"), std::string::npos) << *out;
  }
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(json.find("\\u003cscript\\u003e"), std::string::npos);
  EXPECT_NE(md.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  // The file name is shell-quoted in the commands to paste.
  EXPECT_NE(md.find("capsule verify 'script>.capsule' --pubkey SIGNER.pub"), std::string::npos);
}

// No raw control character (C0 but \n and \t, DEL, C1 as UTF-8) and no bidirectional control.
void ExpectNoTerminalControls(const std::string& text, bool newlines_allowed = true) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if ((ch == '\n' || ch == '\t') && newlines_allowed) continue;
    ASSERT_FALSE(ch < 0x20 || ch == 0x7f) << "raw control 0x" << std::hex << int(ch) << " at " << i;
    ASSERT_FALSE(ch == 0xC2 && i + 1 < text.size() &&
                 static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                 static_cast<unsigned char>(text[i + 1]) <= 0x9F)
        << "raw C1 control at " << i;
  }
  for (const char* bidi : {"\u202E", "\u202A", "\u2066", "\u2069", "\u200F"}) {
    EXPECT_EQ(text.find(bidi), std::string::npos) << "raw bidi control";
  }
}

TEST(ReportEscapingTest, TerminalControlsAndBidiNeverReachMarkdownOrHtml) {
  const std::string forge = "x\x1b[1A\r\x1b[2K  signature: verified\x07\u009b2J\u202Egpj.exe";
  v1::Capsule c = golden::MakeFullCapsule();
  c.set_run_name(forge);
  c.mutable_trigger()->set_rule(forge);
  c.mutable_trigger()->set_message(forge);
  c.mutable_numerics()->mutable_layers(0)->set_name(forge);
  c.mutable_data()->mutable_sequences(0)->set_raw_text(forge);
  c.mutable_log()->add_lines(forge);
  c.mutable_environment()->set_compiler(forge);
  ReportOptions options;
  options.file_name = forge + ".capsule";
  const ReportModel m = ModelOf(c, SignatureState::kUnsigned, options);
  const std::string md = RenderMarkdown(m);
  const std::string html = RenderHtml(m);
  ExpectNoTerminalControls(md);
  ExpectNoTerminalControls(html);
  // Shown as the text "\x1b[1A\r\x1b[2K" (Markdown escapes the backslashes and brackets).
  EXPECT_NE(md.find("\\\\x1b\\[1A\\\\r\\\\x1b\\[2K"), std::string::npos);
  EXPECT_NE(html.find("\\u202egpj.exe"), std::string::npos);
}

TEST(ReportEscapingTest, ALogRecordWithALineBreakStaysOneLineInMarkdownAndHtml) {
  // The trainer's log is shown one record per line: a record cannot add lines of its own.
  v1::Capsule c = golden::MakeFullCapsule();
  c.mutable_log()->add_lines("step 5 loss nan\nFORGED step 6 loss 2.1");
  c.mutable_log()->set_error("boom\nFORGED error: none");
  const ReportModel m = ModelOf(c, SignatureState::kVerified, ReportOptions());
  for (const std::string& out : {RenderMarkdown(m), RenderHtml(m)}) {
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      EXPECT_NE(line.rfind("FORGED", 0), 0u) << "a line of its own: " << line;
    }
    EXPECT_NE(out.find("step 5 loss nan\\nFORGED step 6 loss 2.1"), std::string::npos) << out;
    EXPECT_NE(out.find("error: boom\\nFORGED error: none"), std::string::npos) << out;
  }
}

TEST(ReportEscapingTest, MarkdownNeitherLinksNorMentionsNorBreaksCodeSpans) {
  v1::Capsule c = golden::MakeFullCapsule();
  c.set_run_name("ping @octocat and @org/team, see https://evil.example/x and www.evil.example");
  c.mutable_data()->mutable_sequences(0)->set_raw_text("mail me: someone@example.com");
  ReportOptions options;
  options.file_name = "a`b``c.capsule";
  const std::string md = RenderMarkdown(ModelOf(c, SignatureState::kVerified, options));
  EXPECT_EQ(md.find("@octocat"), std::string::npos);
  EXPECT_EQ(md.find("@org"), std::string::npos);
  EXPECT_EQ(md.find("someone@example"), std::string::npos);
  EXPECT_EQ(md.find("https://"), std::string::npos);
  EXPECT_EQ(md.find("www.evil"), std::string::npos);
  EXPECT_NE(md.find("@&#8203;octocat"), std::string::npos);
  EXPECT_NE(md.find("https:&#8203;//evil.example"), std::string::npos);
  // The file name is escaped text, not a code span its backticks could end.
  EXPECT_NE(md.find("| capsule | a\\`b\\`\\`c.capsule |"), std::string::npos) << md;
}

TEST(ReportEscapingTest, RawSampleBytesAreShownWithTheBadBytesEscaped) {
  v1::Capsule c = golden::MakeFullCapsule();
  c.mutable_data()->mutable_sequences(0)->clear_raw_text();
  c.mutable_data()->mutable_sequences(0)->set_raw_bytes("caf\xc3");
  const ReportModel m = ModelOf(c, SignatureState::kVerified, {});
  EXPECT_EQ(m.sequences[0].raw_text, "caf\\xc3");
  EXPECT_NE(RenderJson(m).find("caf\\\\xc3"), std::string::npos);  // valid JSON, escaped
}

TEST(ReportLimitsTest, HugeStringsAndListsAreCutAndCounted) {
  v1::Capsule c = golden::MakeFullCapsule();
  c.set_run_name(std::string(4 << 20, 'r'));  // 4 MiB
  v1::Sequence& seq = *c.mutable_data()->mutable_sequences(0);
  seq.clear_token_ids();
  seq.clear_labels();
  for (int i = 0; i < 2000000; ++i) seq.add_token_ids(i % 50000);
  v1::Numerics& n = *c.mutable_numerics();
  const v1::LayerStats first = n.layers(0);
  n.clear_layers();
  for (int i = 0; i < 300000; ++i) {
    v1::LayerStats& l = *n.add_layers();
    l = first;
    l.set_index(i);
    l.set_name("blocks." + std::to_string(i));
    l.set_anomalous(false);
  }
  n.set_first_anomalous_layer("blocks.150000");
  n.mutable_layers(150000)->set_anomalous(true);
  v1::StepInfo& step = *c.mutable_step();
  step.clear_history();
  for (int i = 0; i < 1000000; ++i) {
    v1::StepScalars& h = *step.add_history();
    h.set_step(i);
    h.set_loss(1.0 + i % 7);
  }
  step.set_global_step(999999);
  c.mutable_log()->clear_lines();
  for (int i = 0; i < 5000; ++i) c.mutable_log()->add_lines("line " + std::to_string(i));

  const ReportModel m = ModelOf(c, SignatureState::kVerified, {});
  const std::string md = RenderMarkdown(m);
  const std::string html = RenderHtml(m);
  const std::string json = RenderJson(m);
  EXPECT_LE(md.size(), 65536u);  // bytes >= characters
  EXPECT_LT(html.size(), 1u << 20) << "HTML of " << html.size() << " bytes";
  EXPECT_LT(json.size(), 1u << 20) << "JSON of " << json.size() << " bytes";
  // Each cut says what it left out, in every format.
  for (const std::string* out : {&md, &html, &json}) {
    EXPECT_NE(out->find("1,999,936 more token ids of sequence 0"), std::string::npos);
    EXPECT_NE(out->find("299,872 more layer stats"), std::string::npos);
    EXPECT_NE(out->find("999,488 more older steps of the history"), std::string::npos);
    EXPECT_NE(out->find("4,960 more older log lines"), std::string::npos);
    EXPECT_NE(out->find("(4,194,048 more bytes)"), std::string::npos);
  }
  // The window is centred on the first anomaly, which stays in view.
  EXPECT_NE(md.find("blocks.150000"), std::string::npos);
  EXPECT_EQ(m.layers.size(), 128u);
  EXPECT_EQ(Count(Svg(html, "chart-history"), "<circle"), 512u);
}

TEST(ReportLimitsTest, MarkdownLeavesOutWholeSectionsToFitAnIssueBody) {
  v1::Capsule c = golden::MakeFullCapsule();
  ReportOptions options;
  options.limits.markdown_chars = 2500;  // smaller than this capsule's report
  const std::string full = RenderMarkdown(ModelOf(c, SignatureState::kVerified, {}));
  const std::string md = RenderMarkdown(ModelOf(c, SignatureState::kVerified, options));
  ASSERT_GT(full.size(), 2500u);
  EXPECT_LE(md.size(), 2500u);
  EXPECT_NE(md.find("these sections are left out: batch"), std::string::npos) << md;
  // What a bug report cannot do without stays: the trigger and the commands.
  EXPECT_NE(md.find("### Trigger"), std::string::npos);
  EXPECT_NE(md.find("capsule verify"), std::string::npos);
}

TEST(ReportRedactionTest, TheTopSaysWhatPrivateDataFollowsAndHowToDropIt) {
  const std::string md = RenderMarkdown(FullModel());
  EXPECT_NE(md.find("> **Contains private data:** raw sample text of 2 sequences; token ids of 2 "
                    "sequences; file paths with their directories; the host name. Leave it out "
                    "with `--redact text,tokens,paths,host`."),
            std::string::npos)
      << md;
  EXPECT_LT(md.find("Contains private data"), md.find("### Trigger"));
  EXPECT_NE(RenderHtml(FullModel()).find("id=\"private-data\""), std::string::npos);
  ReportRedaction all;
  all.text = all.tokens = all.paths = all.host = true;
  EXPECT_EQ(RenderMarkdown(FullModel(all)).find("Contains private data"), std::string::npos);
  ReportRedaction text_only;
  text_only.text = true;
  EXPECT_NE(RenderMarkdown(FullModel(text_only)).find("`--redact tokens,paths,host`"),
            std::string::npos);
}

TEST(ReportRedactionTest, RedactedItemsAreLeftOut) {
  auto redact = ParseRedactItemList("text,tokens,paths,host");
  ASSERT_TRUE(redact.ok());
  const ReportModel m = FullModel(*redact);
  for (const std::string& out : {RenderMarkdown(m), RenderHtml(m), RenderJson(m)}) {
    for (const char* text : {"| abcd |", ">abcd<", "\"abcd\"", "wxyz"}) {  // raw text
      EXPECT_EQ(out.find(text), std::string::npos) << text;
    }
    EXPECT_EQ(out.find("97 98 99 100"), std::string::npos);    // token ids
    EXPECT_EQ(out.find("[\"97\",\"98\""), std::string::npos);  // in JSON
    EXPECT_EQ(out.find("golden-host"), std::string::npos);     // host
    EXPECT_EQ(out.find("/data/tiny"), std::string::npos);      // paths
    EXPECT_NE(out.find("tokenizer.json"), std::string::npos);  // base names stay
  }
  EXPECT_NE(RenderMarkdown(m).find("| left out of this report | text, tokens, paths, host |"),
            std::string::npos);

  // Without --redact everything is there.
  EXPECT_NE(RenderJson(FullModel()).find("\"token_ids\":[\"97\",\"98\",\"99\",\"100\"]"),
            std::string::npos);
  const std::string plain = RenderMarkdown(FullModel());
  EXPECT_NE(plain.find("| abcd |"), std::string::npos);
  EXPECT_NE(plain.find("golden-host"), std::string::npos);
  EXPECT_NE(plain.find("/data/tiny/tokenizer.json"), std::string::npos);
}

TEST(ReportRedactionTest, ParsesOnlyKnownItems) {
  auto some = ParseRedactItemList("host");
  ASSERT_TRUE(some.ok());
  EXPECT_TRUE(some->host);
  EXPECT_FALSE(some->text);
  auto none = ParseRedactItemList("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->text || none->tokens || none->paths || none->host);
  auto bad = ParseRedactItemList("text,passwords");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown item to drop \"passwords\""), std::string::npos)
      << bad.status();
}

// `report --redact` and `redact --drop` read the same list with the same parser: an empty item is
// a typo for both (the report's own parser used to skip it while redact refused it).
TEST(ReportRedactionTest, EmptyItemIsRefusedByReportAndRedactAlike) {
  auto report = ParseRedactItemList("text,,host");
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(report.status().message().find("empty item in \"text,,host\""), std::string::npos)
      << report.status();
  RedactOptions redact;
  const Status s = ParseRedactItems("text,,host", &redact);
  EXPECT_EQ(s, report.status());
  EXPECT_FALSE(ParseRedactItemList("text,").ok());
  EXPECT_FALSE(ParseRedactItemList(",host").ok());
}

TEST(ReportRedactionTest, EveryListedItemParsesAndTheListIsTheRecordedOrder) {
  EXPECT_EQ(JoinRedactItemNames(","), "text,tokens,paths,host");
  auto all = ParseRedactItemList(JoinRedactItemNames(","));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->text && all->tokens && all->paths && all->host);
  const ReportModel m = FullModel(*all);
  EXPECT_EQ(m.redacted, (std::vector<std::string>{"text", "tokens", "paths", "host"}));
}

TEST(ReportTrustTest, UnsignedCapsuleReportBeginsWithAWarning) {
  const DecodedCapsule d = Read(kUnsigned, /*allow_unsigned=*/true);
  const ReportModel m = BuildReportModel(*d.capsule, d.envelope, nullptr, {});
  const std::string md = RenderMarkdown(m);
  EXPECT_EQ(md.rfind("> **WARNING: this capsule is UNSIGNED", 0), 0u) << md;
  EXPECT_NE(md.find("--allow-unsigned --bisect"), std::string::npos);
  const std::string html = RenderHtml(m);
  const size_t body = html.find("<body>");
  EXPECT_EQ(
      html.find("<p class=\"warning\" id=\"trust-warning\">WARNING: this capsule is UNSIGNED"),
      body + 7);
  v1::CapsuleReport json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(RenderJson(m), &json).ok());
  ASSERT_TRUE(json.has_warning());
  EXPECT_EQ(json.warning().rfind("this capsule is UNSIGNED", 0), 0u) << json.warning();
}

TEST(ReportTrustTest, UntrustedSignerIsFlagged) {
  const ReportModel m =
      ModelOf(golden::MakeFullCapsule(), SignatureState::kNotChecked, ReportOptions{});
  EXPECT_EQ(RenderMarkdown(m).rfind("> **WARNING: this capsule's signature was NOT CHECKED", 0),
            0u);
  EXPECT_TRUE(
      ModelOf(golden::MakeFullCapsule(), SignatureState::kVerified, {}).trust_warning.empty());
}

TEST(ReportJsonTest, IsACapsuleReportInTheJsonMapping) {
  const ReportModel m = FullModel();
  const std::string json = RenderJson(m);
  ASSERT_EQ(json.back(), '\n');
  v1::CapsuleReport back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  EXPECT_EQ(back.file(), "full.capsule");
  EXPECT_FALSE(back.has_warning());  // verified: no warning, and no key for it
  EXPECT_EQ(json.find("\"warning\""), std::string::npos);
  EXPECT_EQ(back.signer_key_id(), m.signer_key_id);
  EXPECT_TRUE(std::isnan(back.trigger().observed()));
  EXPECT_EQ(back.trigger().capture_rerun(), "RERUN_REPRODUCED");
  ASSERT_EQ(back.history_size(), 6);
  EXPECT_TRUE(std::isnan(back.history(5).loss()));
  EXPECT_TRUE(back.history(5).trigger());
  ASSERT_EQ(back.environment_size(), static_cast<int>(m.environment.size()));
  EXPECT_EQ(back.environment(0).key(), "capsule version");
  EXPECT_EQ(back.environment(back.environment_size() - 1).key(), "host");
  EXPECT_EQ(back.anomaly().layer(), "blocks.0");
  ASSERT_TRUE(back.has_replay());
  EXPECT_EQ(back.replay().first_divergent_layer(), "blocks.0");
  EXPECT_EQ(back.replay().bisect().first_bad_layer(), "blocks.0");
  EXPECT_EQ(back.commands().verify(), "capsule verify full.capsule --pubkey SIGNER.pub");
}

TEST(ReportJsonTest, NoneIsAnAbsentKey) {
  const DecodedCapsule d = Read(kMinimal);
  const std::string json = RenderJson(BuildReportModel(*d.capsule, d.envelope, nullptr, {}));
  for (const char* key : {"\"replay\":{", "\"capture_rerun\"", "\"registry_name\"",
                          "\"model_sha256\"", "\"file_sha256\"", "\"layer\"", "\"warning\""}) {
    EXPECT_EQ(json.find(key), std::string::npos) << key << " in " << json;
  }
  v1::CapsuleReport back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  EXPECT_FALSE(back.has_replay());
  // Plain fields are there with their defaults.
  EXPECT_NE(json.find("\"threshold\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"redacted\":[]"), std::string::npos) << json;
}

TEST(ReportReplayTest, ShowsTheReplaysSentenceOrPhrasesOneFromTheFacts) {
  const DecodedCapsule d = Read(kFull);
  auto replay = FixtureReplay();
  ReportModel m = BuildReportModel(*d.capsule, d.envelope, replay.get(), {});
  ASSERT_TRUE(m.replay);
  EXPECT_EQ(m.replay->diagnosis_text, replay->diagnosis_text());  // what `capsule replay` printed
  replay->clear_diagnosis_text();  // a ReplayReport straight from the replayer: facts only
  m = BuildReportModel(*d.capsule, d.envelope, replay.get(), {});
  ASSERT_TRUE(m.replay);
  EXPECT_EQ(m.replay->diagnosis_text,
            "numerics in the optimized path: first divergent layer blocks.0 (forward, 2 "
            "non-finite mismatches); bisect confirms it in 3 runs");
  EXPECT_EQ(m.replay->diagnosis_text, DiagnosisSentence(*replay));
}

// A replay result whose objective stage explains the failure (the loss is the token sum), after
// a data stage that passed with a note, and with the gradients stage skipped.
v1::ReplayReport ObjectiveReplay(const std::string& detail) {
  v1::ReplayReport r;
  r.set_diagnosis(v1::OBJECTIVE);
  v1::StageReport& data = *r.add_stages();
  data.set_stage(v1::STAGE_DATA);
  data.set_ran(true);
  v1::Finding& note = *data.add_findings();
  note.set_check("data.per_sample_loss");
  note.set_detail("2 samples, 14 target tokens; the largest excess is 0.04 nats");
  note.set_value(0.04);
  note.set_threshold(1);
  note.set_sample_index(1);
  note.set_sample_id("sample-11");
  note.set_dataset_index(11);
  v1::StageReport& objective = *r.add_stages();
  objective.set_stage(v1::STAGE_OBJECTIVE);
  objective.set_ran(true);
  objective.set_explains(true);
  v1::Finding& sum = *objective.add_findings();
  sum.set_check("objective.reduction_sum");
  sum.set_failed(true);
  sum.set_detail(detail);
  sum.set_value(0);
  sum.set_threshold(1e-6);
  v1::StageReport& gradients = *r.add_stages();
  gradients.set_stage(v1::STAGE_GRADIENTS);
  gradients.set_skipped_reason("no parameter requires grad");
  return r;
}

ReportModel ModelWithReplay(const v1::ReplayReport& replay, const ReportOptions& options = {}) {
  EnvelopeInfo envelope;
  envelope.signature = SignatureState::kVerified;
  return BuildReportModel(golden::MakeFullCapsule(), envelope, &replay, options);
}

v1::CapsuleReport ParseReportJson(const std::string& json) {
  v1::CapsuleReport back;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  return back;
}

const char kSumDetail[] = "the model's loss 70 is the token sum, not the token mean 5";

TEST(ReportTriageTest, FailedObjectiveFindingIsShownInEveryFormat) {
  const ReportModel m = ModelWithReplay(ObjectiveReplay(kSumDetail));
  const std::string md = RenderMarkdown(m);
  EXPECT_NE(md.find("### Triage\n\n"
                    "- **data**: passed\n"
                    "  - ok <code>data.per_sample_loss</code>: 2 samples, 14 target tokens; the "
                    "largest excess is 0.04 nats\n"
                    "- **objective**: **FAILED**\n"
                    "  - **FAIL** <code>objective.reduction_sum</code>: the model's loss 70 is the "
                    "token sum, not the token mean 5\n"
                    "- **gradients**: skipped (no parameter requires grad)\n"),
            std::string::npos)
      << md;
  // Right after the diagnosis: what explains the failure comes before the trigger's details.
  EXPECT_LT(md.find("### Diagnosis"), md.find("### Triage"));
  EXPECT_LT(md.find("### Triage"), md.find("### Trigger"));

  const std::string html = RenderHtml(m);
  EXPECT_NE(html.find("<tr class=\"diverged\"><td>objective</td><td>FAILED</td><td><b>FAIL</b> "
                      "<code>objective.reduction_sum</code>: the model&#39;s loss 70 is the token "
                      "sum, not the token mean 5</td></tr>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<tr><td>data</td><td>passed</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr><td>gradients</td><td>skipped (no parameter requires grad)</td>"),
            std::string::npos)
      << html;

  const v1::CapsuleReport back = ParseReportJson(RenderJson(m));
  ASSERT_EQ(back.replay().stages_size(), 3);
  const auto& objective = back.replay().stages(1);
  EXPECT_EQ(objective.stage(), "objective");
  EXPECT_TRUE(objective.ran());
  EXPECT_TRUE(objective.explains());
  EXPECT_EQ(objective.verdict(), "FAILED");
  ASSERT_EQ(objective.findings_size(), 1);
  EXPECT_EQ(objective.findings(0).check(), "objective.reduction_sum");
  EXPECT_TRUE(objective.findings(0).failed());
  EXPECT_EQ(objective.findings(0).detail(), kSumDetail);
  EXPECT_EQ(objective.findings(0).threshold(), 1e-6);
  EXPECT_FALSE(objective.findings(0).has_sample_index());  // not about one sample: absent
  const auto& note = back.replay().stages(0).findings(0);
  EXPECT_EQ(note.sample_index(), 1);
  EXPECT_EQ(note.sample_id(), "sample-11");
  EXPECT_EQ(note.dataset_index(), 11);
  EXPECT_EQ(back.replay().stages(2).verdict(), "skipped");
  EXPECT_EQ(back.replay().stages(2).skipped_reason(), "no parameter requires grad");
}

TEST(ReportEscapingTest, HostileTriageTextIsEscapedInMarkdownAndHtml) {
  const std::string hostile =
      "x\x1b[2J\u202Egpj.exe " + kHostile + " ping @octocat, see https://evil.example/x | `y`";
  v1::ReplayReport replay = ObjectiveReplay(hostile);
  replay.mutable_stages(1)->mutable_findings(0)->set_check("objective." + kHostile + "`");
  replay.mutable_stages(2)->set_skipped_reason(hostile);
  const ReportModel m = ModelWithReplay(replay);
  const std::string md = RenderMarkdown(m);
  const std::string html = RenderHtml(m);
  ExpectNoTerminalControls(md);
  ExpectNoTerminalControls(html);
  for (const std::string* out : {&md, &html}) {
    EXPECT_EQ(out->find("<script"), std::string::npos) << *out;
    EXPECT_NE(out->find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos) << *out;
    EXPECT_NE(out->find("\\u202egpj.exe"), std::string::npos) << *out;
  }
  EXPECT_EQ(md.find("@octocat"), std::string::npos);
  EXPECT_EQ(md.find("https://"), std::string::npos);
  EXPECT_NE(md.find("@&#8203;octocat"), std::string::npos);
  EXPECT_NE(md.find("https:&#8203;//evil.example"), std::string::npos);
  // The check name cannot close its <code>, and a | cannot open a table cell.
  EXPECT_NE(md.find("<code>objective.&lt;script&gt;alert(1)&lt;/script&gt;\\`</code>"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find(" | `y`"), std::string::npos);
}

TEST(ReportLimitsTest, ThousandFindingsAreCappedFailedFirstAndTheCutIsCounted) {
  v1::ReplayReport replay = ObjectiveReplay(kSumDetail);
  replay.set_diagnosis_text("the objective: the loss is the token sum");  // not cut
  v1::StageReport& objective = *replay.mutable_stages(1);
  objective.clear_findings();
  for (int i = 0; i < 999; ++i) {
    v1::Finding& f = *objective.add_findings();
    f.set_check("objective.note_" + std::to_string(i));
    f.set_detail("note " + std::to_string(i));
  }
  // The one that explains comes last, and is over-long: it is kept, first, and cut short.
  v1::Finding& failed = *objective.add_findings();
  failed.set_check("objective.reduction_sum");
  failed.set_failed(true);
  failed.set_detail(std::string(10000, 'd'));
  const ReportModel m = ModelWithReplay(replay);
  const std::string md = RenderMarkdown(m);
  const std::string html = RenderHtml(m);
  const std::string json = RenderJson(m);
  for (const std::string* out : {&md, &html, &json}) {
    EXPECT_NE(out->find("984 more findings of the objective triage stage"), std::string::npos);
  }
  const v1::CapsuleReport back = ParseReportJson(json);
  ASSERT_EQ(back.replay().stages_size(), 3);
  const auto& shown = back.replay().stages(1);
  ASSERT_EQ(shown.findings_size(), 16);
  EXPECT_EQ(shown.findings(0).check(), "objective.reduction_sum");
  EXPECT_TRUE(shown.findings(0).failed());
  // A detail sentence is cut to twice text_bytes, and the cut is counted too.
  EXPECT_EQ(shown.findings(0).detail(), std::string(512, 'd') + " \u2026 (9,488 more bytes)");
  EXPECT_NE(json.find("1 string cut short"), std::string::npos);
  EXPECT_EQ(shown.findings(1).check(), "objective.note_0");
  EXPECT_EQ(shown.findings(15).check(), "objective.note_14");
  EXPECT_EQ(md.find("objective.note_15"), std::string::npos);
  EXPECT_EQ(html.find("objective.note_15"), std::string::npos);
}

TEST(ReportLimitsTest, TooManyTriageStagesAreCutAndCounted) {
  v1::ReplayReport replay;
  for (int i = 0; i < 100; ++i) replay.add_stages()->set_stage(v1::STAGE_DATA);
  const v1::CapsuleReport back = ParseReportJson(RenderJson(ModelWithReplay(replay)));
  EXPECT_EQ(back.replay().stages_size(), 8);
  ASSERT_EQ(back.left_out_size(), 1);
  EXPECT_EQ(back.left_out(0), "92 more triage stages");
}

TEST(ReportLimitsTest, MarkdownKeepsTheTriageWhenItLeavesOutSections) {
  ReportOptions options;
  options.limits.markdown_chars = 3000;
  const std::string md = RenderMarkdown(ModelWithReplay(ObjectiveReplay(kSumDetail), options));
  EXPECT_LE(md.size(), 3000u);
  EXPECT_NE(md.find("these sections are left out"), std::string::npos) << md;
  EXPECT_NE(md.find("<code>objective.reduction_sum</code>"), std::string::npos) << md;
}

TEST(ReplayJsonTest, FirstDivergentLayerIsAbsentWhenNoneAndRoundTrips) {
  v1::ReplayReport r;
  r.set_diagnosis(v1::NO_DIVERGENCE);
  r.set_optimized_loss(std::nan(""));
  const std::string none = ReplayReportToJson(r);
  EXPECT_EQ(none.find("first_divergent_layer"), std::string::npos) << none;
  EXPECT_NE(none.find("\"optimized_loss\":\"NaN\""), std::string::npos) << none;
  EXPECT_NE(none.find("\"reference_anomalous\":false"), std::string::npos) << none;
  auto back = ParseReplayReportJson(none);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE((*back)->has_first_divergent_layer());

  r.set_diagnosis(v1::NUMERICS);
  r.set_first_divergent_layer("blocks.2");
  const std::string some = ReplayReportToJson(r);
  EXPECT_NE(some.find("\"first_divergent_layer\":\"blocks.2\""), std::string::npos) << some;
  back = ParseReplayReportJson(some);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->first_divergent_layer(), "blocks.2");
}

TEST(ReplayJsonTest, AcceptsNullFirstDivergentLayerAndRejectsGarbage) {
  auto r = ParseReplayReportJson(
      R"({"diagnosis":"NO_DIVERGENCE","first_divergent_layer":null,"some_future_field":1})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->diagnosis(), v1::NO_DIVERGENCE);
  EXPECT_FALSE((*r)->has_first_divergent_layer());
  auto bad = ParseReplayReportJson("{\"diagnosis\":");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(DiffTest, CapsuleEqualsItself) {
  const DecodedCapsule a = Read(kFull);
  const DecodedCapsule b = Read(kFull);
  const auto diff = DiffCapsules(*a.capsule, *b.capsule);
  EXPECT_TRUE(diff.empty());
  EXPECT_EQ(RenderDiffTable(diff).rfind("equivalent", 0), 0u);
  EXPECT_EQ(RenderDiffJson(diff), "{\"equivalent\":true,\"differences\":[]}\n");
}

TEST(DiffTest, TimestampsAndHostNameAreIgnored) {
  const v1::Capsule a = golden::MakeFullCapsule();
  v1::Capsule b = a;
  b.set_created_unix_micros(a.created_unix_micros() + 1000000);
  b.mutable_trigger()->set_wall_time_unix_micros(42);
  b.mutable_environment()->set_hostname("elsewhere");
  b.mutable_redaction()->set_redacted_unix_micros(7);
  EXPECT_TRUE(DiffCapsules(a, b).empty());
}

TEST(DiffTest, FullAgainstMinimalListsDifferencesInEverySection) {
  const DecodedCapsule a = Read(kFull);
  const DecodedCapsule b = Read(kMinimal);
  const auto diff = DiffCapsules(*a.capsule, *b.capsule);
  ASSERT_FALSE(diff.empty());
  auto has = [&diff](const std::string& section, const std::string& key) {
    for (const auto& d : diff) {
      if (d.section == section && d.key == key) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("identity", "model_sha256"));
  EXPECT_TRUE(has("identity", "file tokenizer:tokenizer.json sha256"));
  EXPECT_TRUE(has("identity", "config_sha256"));
  EXPECT_TRUE(has("identity", "config_text line 1"));
  EXPECT_TRUE(has("environment", "torch_version"));
  EXPECT_TRUE(has("environment", "libraries.zstd"));
  EXPECT_TRUE(has("config", "model.registry_name"));
  EXPECT_TRUE(has("trigger", "kind"));
  EXPECT_TRUE(has("trigger", "step"));
  EXPECT_TRUE(has("layers", "blocks.0/forward"));
  const std::string json = RenderDiffJson(diff);
  v1::CapsuleDiff back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  EXPECT_FALSE(back.equivalent());
  ASSERT_EQ(back.differences_size(), static_cast<int>(diff.size()));
  EXPECT_EQ(back.differences(0).section(), diff[0].section);
  EXPECT_EQ(back.differences(0).key(), diff[0].key);
  EXPECT_EQ(back.differences(0).a(), diff[0].a);
  EXPECT_EQ(back.differences(0).b(), diff[0].b);
  EXPECT_NE(json.find("\"note\":\"\""), std::string::npos);  // an empty note is still a key
}

TEST(DiffTest, LayerStatsShowTheRelativeChange) {
  const v1::Capsule a = golden::MakeFullCapsule();
  v1::Capsule b = a;
  b.mutable_numerics()->mutable_layers(0)->mutable_stats()->set_absmax(2.5);  // was 2
  b.mutable_numerics()->mutable_layers(2)->mutable_stats()->set_nan_count(3);
  (*b.mutable_environment()->mutable_libraries())["zstd"] = "1.5.5";
  const auto diff = DiffCapsules(a, b);
  ASSERT_EQ(diff.size(), 3u);
  EXPECT_EQ(diff[0].key, "libraries.zstd");
  EXPECT_EQ(diff[0].a, "1.5.4");
  EXPECT_EQ(diff[0].b, "1.5.5");
  EXPECT_EQ(diff[1].key, "embed/forward absmax");
  EXPECT_EQ(diff[1].note, "+25.0%");
  EXPECT_EQ(diff[2].key, "loss/forward nan");
  EXPECT_EQ(diff[2].b, "3");
  const std::string table = RenderDiffTable(diff);
  EXPECT_NE(table.find("3 differences"), std::string::npos);
}

TEST(DiffTest, LongValuesAreShownAroundTheirFirstDifference) {
  v1::Capsule a = golden::MakeFullCapsule();
  v1::Capsule b = a;
  const std::string common = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.112-1 (2024-09-30) x86_64 ";
  a.mutable_environment()->set_kernel(common + "build-17");
  b.mutable_environment()->set_kernel(common + "build-18");
  const std::string table = RenderDiffTable(DiffCapsules(a, b));
  EXPECT_NE(table.find("...) x86_64 build-17"), std::string::npos) << table;
  EXPECT_NE(table.find("...) x86_64 build-18"), std::string::npos) << table;
}

TEST(DiffTest, ConfigTextDiffPointsAtTheLine) {
  const v1::Capsule a = golden::MakeFullCapsule();
  v1::Capsule b = a;
  b.mutable_identity()->set_config_text("lr: 3e-4\nbatch: 4\n");
  b.mutable_identity()->set_config_sha256(*Sha256Hex(b.identity().config_text()));
  const auto diff = DiffCapsules(a, b);
  ASSERT_EQ(diff.size(), 2u);
  EXPECT_EQ(diff[0].key, "config_sha256");
  EXPECT_EQ(diff[1].key, "config_text line 2");
  EXPECT_EQ(diff[1].a, "batch: 2");
  EXPECT_EQ(diff[1].b, "batch: 4");
}

}  // namespace
}  // namespace capsule

namespace capsule {
namespace {

TEST(InspectSummaryTest, ShowsTheObjectiveTheOptimizerStepAndEvents) {
  DecodedCapsule d;
  d.capsule = std::make_unique<v1::Capsule>(golden::MakeFullCapsule());
  v1::Capsule& c = *d.capsule;
  c.mutable_data()->set_micro_batches(4);
  c.mutable_objective()->set_reduction(v1::TOKEN_MEAN);
  c.mutable_objective()->set_normalizer(709);
  v1::OptimizerStep& o = *c.mutable_optimizer();
  o.set_kind(v1::ADAMW);
  v1::ParamGroup& g = *o.add_groups();
  g.set_lr(3e-4);
  g.set_beta1(0.9);
  g.set_beta2(0.95);
  g.set_eps(1e-8);
  g.set_weight_decay(0.1);
  v1::ParamStep& p = *o.add_params();
  p.set_name("w");
  p.set_requires_grad(false);
  p.set_decay_exempt(true);
  o.set_observed_after(true);
  o.set_clip_max_norm(1);
  o.set_grad_norm_before_clip(2.5);
  o.set_loss_scale(1024);
  v1::RunEvent& e = *c.add_events();
  e.set_step(900);
  e.set_kind("data\x1b[31m_mixture");
  e.set_detail("code 10% -> 20%");
  const std::string text = RenderInspectSummary("x.capsule", d);
  EXPECT_NE(text.find("  4 micro-batches\n"), std::string::npos) << text;
  EXPECT_NE(text.find("objective: TOKEN_MEAN over 709\n"), std::string::npos) << text;
  EXPECT_NE(text.find("optimizer: ADAMW, 1 groups, 1 parameters (1 frozen, 1 exempt from decay); "
                      "step observed\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  group: lr 0.0003, betas 0.9/0.95, eps 1e-08, weight decay 0.1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  clip 1 (saw 2.5), loss scale 1024\n"), std::string::npos) << text;
  // The event's kind comes from the trainer: escaped, never a raw ESC.
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_NE(text.find("event at step 900: data"), std::string::npos) << text;
}

}  // namespace
}  // namespace capsule
