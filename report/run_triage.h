// Triage of a data-parallel run: every rank writes its own capsule, and TriageRun reads them
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
//   std::vector<capsule::RunCapsule> capsules = ...;   // each read by DecodeCapsule, verified
//   std::unique_ptr<v1::RunTriage> t = capsule::TriageRun(capsules, unreadable, options);
//   std::cout << capsule::RenderRunTriageText(*t);
//
// The analysis reads only the decoded messages: it needs neither LibTorch nor the files. Every
// string it copies from a capsule or a path into the result is escaped and cut (PrintableShort,
// base/printable.h), so the text and the JSON are safe to print.
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_REPORT_RUN_TRIAGE_H_
#define CAPSULE_REPORT_RUN_TRIAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "capsule/format/capsule_fwd.h"

namespace capsule {
namespace v1 {
class RunTriage;
}  // namespace v1

// One capsule read through the verifying reader (never one that failed it).
struct RunCapsule {
  std::string path;
  const v1::Capsule* capsule = nullptr;  // not owned; must outlive the call
};

// A capsule file the verifying reader refused, and why: listed, never used.
struct UnreadableCapsule {
  std::string path;
  std::string reason;
};

struct RunTriageOptions {
  // The run to triage (Distributed.run_id). Empty: the only run among the capsules; with several,
  // the result is TRIAGE_SEVERAL_RUNS and lists them.
  std::string run_id;
  std::string dir;  // the folder the capsules came from, as the result names it
};

// The relative margin by which the reduced gradient's norm must exceed the mean of the ranks'
// local norms before it counts as a sum: the norms are computed in floating point on each rank.
inline constexpr double kReductionNormSlack = 1e-4;

// A capsule.v1.RunTriage (proto/triage.proto): outcome, per-rank evidence, findings in the order
// completeness, gradients, hang, desync, scaling, the undecided checks and the next command.
std::unique_ptr<v1::RunTriage> TriageRun(const std::vector<RunCapsule>& capsules,
                                         const std::vector<UnreadableCapsule>& unreadable,
                                         const RunTriageOptions& options);

// For a terminal: the run line, the evidence table (one row per rank), findings, undecided checks
// and the next command.
std::string RenderRunTriageText(const v1::RunTriage& triage);
// One line of protobuf's JSON mapping (report/internal/json.h).
std::string RenderRunTriageJson(const v1::RunTriage& triage);

}  // namespace capsule

#endif  // CAPSULE_REPORT_RUN_TRIAGE_H_
