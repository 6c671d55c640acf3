#include "capsule/cli/replay_command.h"

#include <unistd.h>

#include <iostream>
#include <sstream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/printable_line.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/base/internal/strings.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/cli/printable_stream.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/parity.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/replayer.h"
#include "capsule/report/parity_text.h"
#include "capsule/report/replay_text.h"
#include "capsule/report/report.h"

namespace capsule::cli {
namespace {

// The diagnosis, fidelity, loss, warnings and each triage stage.
void PrintSummary(const v1::ReplayReport& r, std::ostream& out) {
  using Line = PrintableLine;
  Line(out) << "diagnosis: " << v1::Diagnosis_Name(r.diagnosis()) << ": " << r.diagnosis_text();
  Line(out) << "fidelity: " << v1::Fidelity_Name(r.fidelity()) << " (" << r.fidelity_detail()
            << ")";
  if (!r.extract_layer().empty()) {
    // An extract runs one layer: there is no loss to show.
    Line(out) << "loss: none (the extract runs " << r.extract_layer() << " alone); "
              << r.intra_op_threads() << " intra-op threads";
  } else {
    Line(out) << "loss: optimized " << FormatSignificant(r.optimized_loss(), 3) << ", reference "
              << FormatSignificant(r.reference_loss(), 3)
              << (r.reference_anomalous() ? " (reference anomalous)" : "") << "; "
              << r.intra_op_threads() << " intra-op threads";
  }
  for (const auto& w : r.warnings()) Line(out) << "warning: " << w;
  // The triage stages in their order: which one explains, and each finding that failed or says
  // something (a pass of the data stage states its margin).
  for (const auto& s : r.stages()) {
    Line(out) << "stage " << StageName(s.stage()) << ": " << StageVerdict(s)
              << (s.ran() ? "" : " (" + s.skipped_reason() + ")");
    for (const auto& f : s.findings()) {
      Line(out) << "  " << (f.failed() ? "FAIL " : "ok   ") << f.check() << ": " << f.detail();
    }
  }
}

void PrintLayerTable(const v1::ReplayReport& r, std::ostream& out) {
  using Line = PrintableLine;
  // Each row shows the bound applied to it (atol + rtol*|ref|, atol already scaled for gradients)
  // and the worst error as a multiple of it: above 1 fails. A relative error alone misleads on a
  // near-zero reference.
  Line{out};
  Line(out) << Pad("phase", 9) << Pad("layer", 12) << Pad("tensor", 26) << Pad("max abs err", 13)
            << Pad("allowed: atol + rtol*|ref|", 28) << Pad("err/allowed", 13)
            << Pad("non-finite", 12) << "verdict";
  for (const auto& l : r.layers()) {
    // The same spelling as the Markdown and HTML reports: the enum's name.
    std::string verdict = v1::Verdict_Name(l.verdict());
    if (r.has_first_divergent_layer() && l.name() == r.first_divergent_layer() &&
        l.phase() == r.first_divergent_phase()) {
      verdict += "  <- first divergence";
    }
    Line(out) << Pad(l.phase() == v1::FORWARD ? "forward" : "backward", 9) << Pad(l.name(), 12)
              << Pad(l.tensor(), 26) << Pad(FormatSignificant(l.max_abs_err(), 3), 13)
              << Pad(FormatSignificant(l.atol_applied(), 3) + " + " +
                         FormatSignificant(l.rtol(), 3) + "*|ref|",
                     28)
              << Pad(FormatSignificant(l.worst_ratio(), 3), 13)
              << Pad(std::to_string(l.nonfinite_mismatch()), 12) << verdict;
  }
}

// The forward and backward layer bisects, each with its probes.
void PrintBisects(const v1::ReplayReport& r, std::ostream& out) {
  using Line = PrintableLine;
  for (const v1::BisectReport* b : {r.has_bisect() ? &r.bisect() : nullptr,
                                    r.has_backward_bisect() ? &r.backward_bisect() : nullptr}) {
    if (b == nullptr) continue;
    const bool backward = b->phase() == v1::BACKWARD;
    Line{out};
    Line(out) << (backward ? "backward bisect (" : "bisect (") << b->strategy()
              << "): first bad layer "
              << (b->first_bad_layer().empty() ? "none" : b->first_bad_layer()) << " after "
              << b->probes() << " composite runs of " << b->layers() << " layers (bound "
              << b->probe_bound() << ")"
              << (b->strategy() != "linear" ? ""
                  : b->monotonic()          ? "; monotonic"
                                            : "; NOT monotonic");
    Line(out) << (backward ? "  (k=K: layers 0..K-1 forward and backward on the optimized path, "
                             "the rest on the reference; parameter gradients compared)"
                           : "  (k=K: layers 0..K-1 on the optimized path, the rest on the "
                             "reference)");
    for (const auto& p : b->probe_log()) {
      Line(out) << "  k=" << Pad(std::to_string(p.k()), 4) << Pad(p.bad() ? "bad" : "good", 6)
                << "max rel err " << Pad(FormatSignificant(p.max_rel_err(), 3), 10) << "non-finite "
                << p.nonfinite_mismatch();
    }
  }
}

void PrintFeatureBisect(const v1::ReplayReport& r, std::ostream& out) {
  using Line = PrintableLine;
  if (r.has_features()) {
    const v1::FeatureBisectReport& f = r.features();
    auto join = [](const auto& names) {
      std::string s;
      for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
      return s.empty() ? std::string("none") : s;
    };
    std::string outcome;
    switch (f.outcome()) {
      case v1::FeatureBisectReport::FOUND:
        outcome = f.target_layer() + " (" +
                  (f.target_phase() == v1::BACKWARD ? "backward" : "forward") + ") diverges with " +
                  join(f.culprits()) + " on";
        break;
      case v1::FeatureBisectReport::NOT_IN_SWITCHES:
        outcome =
            f.target_layer() + " diverges with every switch off: not in a switchable optimization";
        break;
      case v1::FeatureBisectReport::NO_TARGET:
        outcome = "no divergent layer to hold";
        break;
      default:
        outcome = "the model exposes no optimization switches";
        break;
    }
    Line{out};
    Line(out) << "features bisect over " << f.switches_size() << " switches (" << join(f.switches())
              << "): " << outcome << "; " << f.replays() << " replays (bound " << f.replay_bound()
              << ")";
    for (const auto& p : f.probes()) {
      Line(out) << "  on: " << Pad(join(p.enabled()), 40)
                << Pad(p.bad() ? "diverges" : "agrees", 10) << "max rel err "
                << FormatSignificant(p.max_rel_err(), 3);
    }
  }
}

void PrintRepeat(const v1::ReplayReport& r, std::ostream& out) {
  using Line = PrintableLine;
  if (r.has_repeat()) {
    const v1::RepeatReport& rep = r.repeat();
    Line{out};
    Line(out) << "repeat: " << rep.runs() << " replays, "
              << (rep.bitwise_identical() ? "bitwise identical" : "NOT bitwise identical")
              << "; reproduced in " << rep.reproduced_runs() << " of " << rep.runs()
              << (rep.not_checked_runs() > 0
                      ? " (" + std::to_string(rep.not_checked_runs()) + " not checked)"
                      : "");
    for (int i = 0; i < rep.spreads_size() && i < 16; ++i) {
      const v1::MetricSpread& m = rep.spreads(i);
      Line(out) << "  " << m.metric() << ": " << FormatSignificant(m.min(), 6) << " .. "
                << FormatSignificant(m.max(), 6);
    }
    if (rep.spreads_size() > 16) Line(out) << "  ... " << rep.spreads_size() - 16 << " more";
  }
}

// The command that replays the capsule, and the extracts of the first divergent layer.
void PrintCommands(const v1::ReplayReport& r, std::ostream& out) {
  using Line = PrintableLine;
  if (!r.replay_command().empty()) {
    Line{out};
    Line(out) << "replay: " << r.replay_command();
  }
  if (r.next_commands_size() > 0) {
    Line(out) << "next: the first divergent layer alone (an extract replays just that layer):";
    for (const auto& c : r.next_commands()) Line(out) << "  " << c;
  }
}

// Parity mode: the verdict, then the table of positions and cached tensors.
void PrintParity(const v1::ParityReport& p, std::ostream& out) {
  PrintableLine{out};
  PrintableLine(out) << "parity: " << ParitySentence(p);
  std::istringstream table(ParityTable(p));
  for (std::string line; std::getline(table, line);) PrintableLine(out) << "  " << line;
}

// Every line goes through PrintableLine: layer names, warnings, findings, file names and the
// commands quote the capsule, its file name or the model.
void PrintHuman(const v1::ReplayReport& r, std::ostream& out) {
  PrintSummary(r, out);
  PrintLayerTable(r, out);
  PrintBisects(r, out);
  PrintFeatureBisect(r, out);
  PrintRepeat(r, out);
  if (r.has_parity()) PrintParity(r.parity(), out);
  PrintCommands(r, out);
}

// Parses "NAME=ATOL,RTOL".
bool ParseLayerTol(const std::string& s, std::string* name, Tolerance* tol) {
  const size_t eq = s.find('=');
  const size_t comma = s.find(',', eq == std::string::npos ? 0 : eq);
  if (eq == std::string::npos || eq == 0 || comma == std::string::npos) return false;
  try {
    *name = s.substr(0, eq);
    tol->atol = std::stod(s.substr(eq + 1, comma - eq - 1));
    tol->rtol = std::stod(s.substr(comma + 1));
  } catch (const std::exception&) {
    return false;
  }
  return tol->atol >= 0 && tol->rtol >= 0;
}

}  // namespace

void SetupReplayCommand(CLI::App& app, RunFn* run, ModelRegistry* registry) {
  auto options = std::make_shared<ReplayCliOptions>();
  CLI::App* cmd = app.add_subcommand("replay", kReplayDescription);
  cmd->add_option("file", options->file, "Capsule file")->required();
  AddPluginOption(cmd, &options->plugins);
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->add_option("--weights", options->weights,
                  "Capsule holding all weights, when this one does not embed them")
      ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", options->checkpoint,
                  "The weights checkpoint the capsule names, when it is not at the recorded path")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--force", options->force, "Replay despite a torch version or model hash mismatch");
  cmd->add_option("--phase", options->phase, "Layerwise phases to compare")
      ->check(CLI::IsMember({"forward", "backward", "both"}));
  // A flag whose value can only be attached (--bisect=linear): `--bisect FILE` leaves FILE the
  // capsule, as it reads, instead of taking it for the strategy.
  cmd->add_flag("--bisect{bisect}", options->bisect,
                "Find the first bad layer by composite runs: --bisect (or --bisect=bisect), "
                "--bisect=linear; or the optimization switches the divergence needs: "
                "--bisect=features")
      ->check(CLI::IsMember({"bisect", "linear", "features"}));
  cmd->add_option("--features", options->features,
                  "Turn on exactly these optimization switches of the model (comma-separated; "
                  "'none': all off)")
      ->delimiter(',');
  cmd->add_option("--atol", options->atol, "Absolute tolerance for every layer")
      ->check(NonNegativeNumber());
  cmd->add_option("--rtol", options->rtol, "Relative tolerance for every layer")
      ->check(NonNegativeNumber());
  cmd->add_option("--layer-tol", options->layer_tol, "Per-layer tolerance NAME=ATOL,RTOL");
  cmd->add_option("--repeat", options->repeat,
                  "Replay N times from a fresh state: bitwise identical, or the spread of each "
                  "metric")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--parity", options->parity,
                "Compare the whole-sequence forward with prefill + cached decode (automatic for a "
                "capsule with a generation section)");
  cmd->add_option("--prefill", options->prefill,
                  "Parity: tokens prefilled before token-by-token decode (default: the capsule's "
                  "prompt length, else half the sequence)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--chunk", options->chunk,
                  "Parity: prefill chunk size (default: the capsule's, else the whole prefill)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--adapter-merge", options->adapter_merge,
                  "Parity: merge the model's adapters into their weights in this dtype and check "
                  "the merge (default: float32 when the capsule records a merged adapter)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  cmd->add_flag("--json", options->json, "Print the result as JSON");
  cmd->callback([options, run, registry, cmd] {
    options->bisect_given = cmd->count("--bisect") > 0;
    *run = [options, registry] { return RunReplayCommand(*options, *registry); };
  });
}

namespace {

// The library's options from the command line's; kInvalidArgument for a bad --layer-tol.
StatusOr<ReplayOptions> ReplayOptionsOf(const ReplayCliOptions& o) {
  ReplayOptions options;
  options.weights_path = o.weights;
  options.checkpoint_path = o.checkpoint;
  options.capsule_path = o.file;
  options.force = o.force;
  options.repeat = o.repeat;
  options.forward = o.phase != "backward";
  options.backward = o.phase != "forward";
  if (o.bisect_given && o.bisect == "features") {
    options.bisect_features = true;
  } else if (o.bisect_given) {
    options.bisect = o.bisect == "linear" ? BisectMode::kLinear : BisectMode::kBisect;
  }
  if (!o.features.empty()) {
    options.features.emplace();
    for (const std::string& f : o.features) {
      if (f != "none") options.features->push_back(f);
    }
  }
  if (o.atol || o.rtol) {
    options.compare.tolerance = Tolerance{o.atol.value_or(0), o.rtol.value_or(0)};
  }
  for (const std::string& s : o.layer_tol) {
    std::string name;
    Tolerance tol;
    if (!ParseLayerTol(s, &name, &tol)) {
      return InvalidArgumentError("--layer-tol " + s + " is not NAME=ATOL,RTOL");
    }
    options.compare.layer_tolerance[name] = tol;
  }
  options.parity = o.parity || o.prefill > 0 || o.chunk > 0 || !o.adapter_merge.empty();
  if (!o.adapter_merge.empty()) {
    options.parity_options.adapter_merge =
        o.adapter_merge == "bfloat16" ? at::kBFloat16 : at::kFloat;
  }
  options.parity_options.prefill = o.prefill;
  options.parity_options.chunk = o.chunk;
  options.parity_options.compare = options.compare;
  return options;
}

// The flags that change what the replay computes, for the command that repeats it.
std::string ReplayFlags(const ReplayCliOptions& o) {
  std::string flags;
  if (!o.checkpoint.empty()) flags += " --checkpoint " + o.checkpoint;
  if (o.bisect_given) flags += " --bisect=" + o.bisect;
  if (o.phase != "forward") flags += " --phase " + o.phase;
  if (o.repeat > 1) flags += " --repeat " + std::to_string(o.repeat);
  if (!o.features.empty()) {
    std::string list;
    for (const std::string& f : o.features) list += (list.empty() ? "" : ",") + f;
    flags += " --features " + list;
  }
  if (o.parity) flags += " --parity";
  if (o.prefill > 0) flags += " --prefill " + std::to_string(o.prefill);
  if (o.chunk > 0) flags += " --chunk " + std::to_string(o.chunk);
  if (!o.adapter_merge.empty()) flags += " --adapter-merge " + o.adapter_merge;
  return flags;
}

}  // namespace

int RunReplayCommand(const ReplayCliOptions& o, ModelRegistry& registry) {
  StatusOr<ReplayOptions> parsed = ReplayOptionsOf(o);
  if (!parsed.ok()) {
    PrintError(parsed.status());
    return kExitError;
  }
  ReplayOptions options = std::move(*parsed);
  options.progress = ProgressLine("replay");  // null unless standard error is a terminal

  int rc = kExitError;
  std::optional<CommandInput> input =
      OpenCommandInput({o.file, o.trust, "", PluginModels(o.plugins, registry)}, &rc);
  if (!input) return rc;
  const LoadedCapsule* loaded = &input->capsule;
  auto report = ReplayCapsule(*loaded->decoded.capsule, registry, options);
  if (options.progress) ClearProgressLine();
  if (!report.ok()) {
    RerunFacts facts = RerunFactsOf(*loaded->decoded.capsule, registry);
    facts.has_force = facts.has_weights = true;
    facts.force = o.force;
    facts.weights = !o.weights.empty();
    facts.checkpoint = !o.checkpoint.empty();
    PrintError(report.status(), RerunRemedy(report.status(), facts));
    return kExitError;
  }
  report->set_capsule(o.file);
  report->set_capsule_sha256(loaded->sha256);
  *report->mutable_capsule_trust() = loaded->trust;
  // The trust flags this replay was given: the commands below need the same to read the capsule.
  std::string trust_flags;
  for (const auto& k : o.trust.pubkeys) trust_flags += " --pubkey " + k;
  if (o.trust.allow_untrusted) trust_flags += " --allow-untrusted";
  if (o.trust.allow_unsigned) trust_flags += " --allow-unsigned";
  const Invocation& invocation = CurrentInvocation();
  std::string cmd = invocation.program + " replay " + o.file + ModelArgs(o.plugins) + trust_flags;
  report->set_replay_command(cmd + ReplayFlags(o));
  // NUMERICS names a layer: the next step is that layer alone, small enough to attach and fast to
  // re-run under a debugger. Extracts need every weight; without them, say how to get them.
  if (report->diagnosis() == v1::NUMERICS && report->has_first_divergent_layer() &&
      report->extract_layer().empty()) {
    const std::string& layer = report->first_divergent_layer();
    const std::string plugins = ModelArgs(o.plugins);
    const std::string out = layer + ".capsule";
    const bool weights = loaded->decoded.capsule->model().weight_policy() == v1::WEIGHTS_ALL;
    report->add_next_commands(invocation.program + " extract " + o.file + " --layer " + layer +
                              " --key YOUR.key -o " + out + plugins + trust_flags +
                              (weights ? "" : "   # needs a capsule with all weights"));
    report->add_next_commands(invocation.program + " replay " + out + plugins +
                              " --pubkey YOUR.pub");
  }
  report->set_diagnosis_text(DiagnosisSentence(*report));
  if (o.json) {
    std::cout << ReplayReportToJson(*report);
  } else {
    PrintHuman(*report, std::cout);
  }
  bool parity_finding = report->has_parity() && report->parity().diverged();
  for (const v1::ParityFinding& f : report->parity().findings()) parity_finding |= f.failed();
  return report->diagnosis() == v1::NO_DIVERGENCE && !parity_finding ? kExitOk : kExitFinding;
}

}  // namespace capsule::cli
