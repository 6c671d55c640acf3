// The cross-rank analysis of a data-parallel run: every rank writes its own capsule, and
// AnalyseRun reads them
// together to say which rank went bad first and why the run stopped. It aligns the ranks'
// collective rings by sequence number (a skipped or mismatched collective, a rank that never
// issued one, a dead peer), finds the first step whose pre-reduction gradients were non-finite on
// some rank (one rank: its data; every rank: a replicated bug; only after the reduction: an
// overflow there), compares the step fingerprints (replicas whose parameters or replicated RNG
// differ, rank-local RNG seeded alike) and checks the reduction's scaling (a reduced norm above
// the mean of the local norms is a sum where a mean was meant). A finding that needs a rank
// whose capsule is missing is reported as undecided ("cannot decide: no capsule from rank 3"),
// never guessed.
//
//   capsule::RunAnalysisInput input;
//   for (...) input.Add(path, capsule);   // each read by DecodeCapsule, verified; then dropped
//   std::unique_ptr<v1::RunTriage> t = capsule::AnalyseRun(input, options);
//   std::cout << capsule::RenderRunAnalysisText(*t);
//
// The result keeps its wire name, capsule.v1.RunTriage (proto/triage.proto), and the command
// line keeps its verb, `capsule triage DIR`: files and scripts written against either still read.
//
// The analysis reads only the decoded messages: it needs neither LibTorch nor the files. Every
// string it copies from a capsule or a path into the result is escaped and cut (PrintableShort,
// base/internal/printable.h), so the text and the JSON are safe to print. Its work and its result
// are bounded by the capsules given, never by what they claim: a world size of 2^31 - 1 costs what
// the ranks present cost (the missing ones are ranges), and sequence numbers far apart cost what
// the entries present cost.
//
// Thread safety: AnalyseRun and the renderers are pure functions; a RunAnalysisInput is used from
// one thread at a time.
#ifndef CAPSULE_RANKS_RUN_ANALYSIS_H_
#define CAPSULE_RANKS_RUN_ANALYSIS_H_

#include <memory>
#include <string>
#include <vector>

#include "capsule/format/capsule_fwd.h"

namespace capsule {
namespace v1 {
class RunTriage;
}  // namespace v1

struct RunAnalysisOptions {
  // The run to analyse (Distributed.run_id). Empty: the only run among the capsules; with several,
  // the result is TRIAGE_SEVERAL_RUNS and lists them.
  std::string run_id;
  std::string dir;  // the folder the capsules came from, as the result names it
};

// The capsules of one folder, given one at a time. Add keeps only what the analysis reads of a
// capsule (its placement, step, trigger kind, objective and distributed section: a few kB, never
// its tensors), so a caller can read, add and drop each capsule in turn and hold one at a time.
class RunAnalysisInput {
 public:
  RunAnalysisInput();
  ~RunAnalysisInput();
  RunAnalysisInput(const RunAnalysisInput&) = delete;
  RunAnalysisInput& operator=(const RunAnalysisInput&) = delete;

  // A capsule read through the verifying reader (never one that failed it); `capsule` may be
  // destroyed as soon as this returns.
  void Add(const std::string& path, const v1::Capsule& capsule);
  // A capsule file the verifying reader refused, and why: listed, never used.
  void AddUnreadable(const std::string& path, const std::string& reason);

 private:
  friend std::unique_ptr<v1::RunTriage> AnalyseRun(const RunAnalysisInput& input,
                                                   const RunAnalysisOptions& options);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The relative margin by which the reduced gradient's norm must exceed the mean of the ranks'
// local norms before it counts as a sum: the norms are computed in floating point on each rank.
inline constexpr double kReductionNormSlack = 1e-4;

// A capsule.v1.RunTriage (proto/triage.proto): outcome, per-rank evidence, findings in the order
// completeness, gradients, hang, desync, scaling, the undecided checks and the next command.
std::unique_ptr<v1::RunTriage> AnalyseRun(const RunAnalysisInput& input,
                                          const RunAnalysisOptions& options);

// For a terminal: the run line, the evidence table (one row per rank), findings, undecided checks
// and the next command.
std::string RenderRunAnalysisText(const v1::RunTriage& triage);
// One line of the project's JSON printer (format/json.h), with a trailing newline.
std::string RenderRunAnalysisJson(const v1::RunTriage& triage);

}  // namespace capsule

#endif  // CAPSULE_RANKS_RUN_ANALYSIS_H_
