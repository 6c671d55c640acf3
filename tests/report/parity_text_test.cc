// The parity renderers: the sentence names the first divergent position and layer, the tolerance
// and the failed check with its numbers; the table has a line per position; the chart a bar per
// position and the tolerance line.
#include "capsule/report/parity_text.h"

#include <gtest/gtest.h>

#include <string>

#include "capsule/format/envelope.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/report/report.h"
#include "samples/golden/golden_capsules.h"

namespace capsule {
namespace {

v1::ParityReport Diverged() {
  v1::ParityReport r;
  r.mutable_schedule()->set_sequence_length(4);
  r.mutable_schedule()->set_prefill(2);
  r.mutable_schedule()->set_chunk(2);
  r.mutable_tolerance()->set_dtype("Float");
  r.mutable_tolerance()->set_atol(2e-5);
  r.mutable_tolerance()->set_rtol(1e-5);
  r.set_diverged(true);
  r.set_first_divergent_position(2);
  r.set_first_divergent_layer("blocks.1");
  r.set_first_divergent_layer_index(2);
  r.set_worst_ratio(412);
  r.set_candidate_value(0.0113);
  r.set_reference_value(0.0071);
  for (int p = 0; p < 4; ++p) {
    v1::ParityPosition* pos = r.add_positions();
    pos->set_position(p);
    pos->set_decoded(p >= 2);
    pos->set_worst_layer(p >= 2 ? "blocks.1" : "embed");
    pos->set_worst_ratio(p >= 2 ? 412 : 0.01);
    pos->set_diverged(p >= 2);
  }
  v1::ParityFinding* f = r.add_findings();
  f->set_check("attention.causal_mask_offset");
  f->set_failed(true);
  f->set_layer("blocks.1");
  f->set_position(2);
  return r;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ParityText, SentenceNamesPositionLayerToleranceAndCheck) {
  const std::string s = ParitySentence(Diverged());
  EXPECT_TRUE(Has(s, "at position 2, layer blocks.1 (error 412x its tolerance")) << s;
  EXPECT_TRUE(Has(s, "0.0113 vs reference 0.0071")) << s;
  EXPECT_TRUE(Has(s, "prefill 2, then 2 decode steps; Float tolerance atol 2e-05, rtol 1e-05"))
      << s;
  EXPECT_TRUE(Has(s, "attention.causal_mask_offset: ")) << s;
  EXPECT_TRUE(Has(s, "ignores the cache's offset")) << s;
}

TEST(ParityText, CleanSentenceSaysSoWithTheTolerance) {
  v1::ParityReport r = Diverged();
  r.set_diverged(false);
  r.clear_findings();
  const std::string s = ParitySentence(r);
  EXPECT_TRUE(Has(s, "no divergence")) << s;
  EXPECT_TRUE(Has(s, "atol 2e-05")) << s;
}

TEST(ParityText, TableHasALinePerPositionAndMarksDivergence) {
  const std::string t = ParityTable(Diverged());
  EXPECT_TRUE(Has(t, "0         prefill  embed         0.01\n")) << t;
  EXPECT_TRUE(Has(t, "3         decode   blocks.1      412  DIVERGED\n")) << t;
}

TEST(ParityText, ChartHasABarPerPositionAndTheToleranceLine) {
  const std::string svg = ParityChartSvg(Diverged());
  size_t bars = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) {
    ++bars;
  }
  EXPECT_EQ(bars, 4u);
  EXPECT_TRUE(Has(svg, "stroke-dasharray")) << svg;
  EXPECT_TRUE(Has(svg, "position 3: blocks.1 412x tolerance")) << svg;
  EXPECT_TRUE(Has(svg, "fill=\"#c0392b\"")) << svg;
}

// The reports show a replay's parity result beside the layerwise one; a hostile layer name is
// escaped in both.
TEST(ParityText, ReportsShowTheSentenceTableAndChartEscaped) {
  v1::ReplayReport replay;
  *replay.mutable_parity() = Diverged();
  replay.mutable_parity()->mutable_positions(3)->set_worst_layer("<script>x</script>");
  EnvelopeInfo envelope;
  const ReportModel m = BuildReportModel(golden::MakeFullCapsule(), envelope, &replay, {});
  const std::string html = RenderHtml(m);
  EXPECT_TRUE(Has(html, "<h2>Inference parity (whole sequence vs cached decode)</h2>"));
  EXPECT_TRUE(Has(html, "class=\"parity-chart\""));
  EXPECT_TRUE(Has(html, "at position 2, layer blocks.1"));
  EXPECT_FALSE(Has(html, "<script>")) << html;
  const std::string md = RenderMarkdown(m);
  EXPECT_TRUE(Has(md, "### Inference parity")) << md;
  EXPECT_TRUE(Has(md, "412  DIVERGED")) << md;
  EXPECT_FALSE(Has(md, "<script>")) << md;
  const std::string json = RenderJson(m);
  EXPECT_TRUE(Has(json, "\"parity\":{\"schedule\":{")) << json;
  EXPECT_TRUE(Has(json, "\"first_divergent_layer\":\"blocks.1\"")) << json;
  EXPECT_TRUE(Has(json, "\"check\":\"attention.causal_mask_offset\"")) << json;
  // Without a parity result there is no section.
  replay.clear_parity();
  const ReportModel none = BuildReportModel(golden::MakeFullCapsule(), envelope, &replay, {});
  EXPECT_FALSE(Has(RenderHtml(none), "Inference parity"));
  EXPECT_FALSE(Has(RenderJson(none), "\"parity\"")) << RenderJson(none);
}

// Adapter mode: each adapter check's sentence carries its numbers, and a failed one is said
// even when no activation departs.
TEST(ParityText, AdapterChecksAreSaidWithTheirNumbers) {
  v1::ParityReport r = Diverged();
  r.clear_findings();
  v1::ParityFinding* f = r.add_findings();
  f->set_check("adapter.merge_rounding");
  f->set_failed(true);
  f->set_layer("blocks.1");
  f->set_tensor("blocks.1.attn.proj.weight");
  f->set_value(31000);
  f->set_threshold(6);
  std::string s = ParitySentence(r);
  EXPECT_TRUE(Has(s,
                  "adapter.merge_rounding: the merged weight blocks.1.attn.proj.weight in "
                  "blocks.1 at position 0 is off base + delta by 3.1e+04 epsilons of its dtype "
                  "(a merge in that dtype stays within 6)"))
      << s;
  r.set_diverged(false);
  f->set_check("adapter.merged_twice");
  f->set_value(2);
  f->set_threshold(1.5);
  s = ParitySentence(r);
  EXPECT_TRUE(Has(s, "no divergence")) << s;
  EXPECT_TRUE(Has(s, "; but adapter.merged_twice: the merged weight blocks.1.attn.proj.weight"))
      << s;
  EXPECT_TRUE(Has(s, "holds 2x the adapter's delta (1 for a merge): the merge was applied twice"))
      << s;
}

}  // namespace
}  // namespace capsule
