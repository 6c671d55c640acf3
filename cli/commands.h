// The subcommands of `capsule`: one file each (keygen_command.cc, ...), each with an options
// struct, a Setup function that declares its flags on a CLI11 app, and a Run function that does
// the work through the libraries and returns the exit status. Internal to the CLI.
#ifndef CAPSULE_CLI_COMMANDS_H_
#define CAPSULE_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

// Setup functions register the subcommand and set `*run` to the action to take when it is chosen.
using RunFn = std::function<int()>;

struct KeygenOptions {
  std::string out_prefix;
};
void SetupKeygenCommand(CLI::App& app, RunFn* run);
int RunKeygenCommand(const KeygenOptions& options);

// What a command does with the capsules it reads, which decides the trust it asks of them
// (cli/capsule.md, "Trust"). A capsule is trusted when a --pubkey key signed it and the makers of
// every capsule it was made from trusted theirs (format/derivation.h).
enum class CapsuleUse {
  // Shows what a capsule holds (inspect, report), with its trust stated: read whoever signed it;
  // unsigned only with --allow-unsigned; with --pubkey, only a trusted one unless
  // --allow-untrusted.
  kShow,
  // Acts on a capsule's content (replay, diff, triage, gate, stress, extract, minimize, redact):
  // only a trusted one, unless --allow-untrusted (--allow-unsigned for an unsigned one) says to
  // go on anyway. What such a command concludes, or writes, is worth the trust of what it read.
  kAct,
};

struct TrustOptions {
  std::vector<std::string> pubkeys;
  bool allow_untrusted = false;  // use capsules no --pubkey key vouches for
  bool allow_unsigned = false;   // ... unsigned ones too (implies allow_untrusted)
  // Set by AddTrustOptions: the command's name, for messages, and its use of capsules.
  std::string command;
  CapsuleUse use = CapsuleUse::kAct;
};

// Declares --pubkey (repeatable, must exist), --allow-untrusted and --allow-unsigned, the trust
// options of every subcommand that reads a capsule except verify, and records `use`.
void AddTrustOptions(CLI::App* cmd, TrustOptions* trust, CapsuleUse use);

// A finite number >= 0; says so with the value given ("--atol: -1 is not a number >= 0"), where
// CLI::NonNegativeNumber would print the largest double.
CLI::Validator NonNegativeNumber();

// Declares --force: replace an existing regular file at the output path (never anything else,
// and never the command's own input).
void AddForceOption(CLI::App* cmd, bool* force);

// --plugin SO (repeatable): shared libraries registering the models a command re-runs.
void AddPluginOption(CLI::App* cmd, std::vector<std::string>* plugins);

struct InspectOptions {
  std::string file;
  TrustOptions trust;
  bool json = false;
  bool full = false;  // include tensor bytes (base64) in --json
};
void SetupInspectCommand(CLI::App& app, RunFn* run);
int RunInspectCommand(const InspectOptions& options);

struct VerifyOptions {
  std::string file;
  std::vector<std::string> pubkeys;
  bool deep = false;        // also re-hash every embedded tensor and validate the content
  std::string save_signer;  // write the public key a 1.1 capsule carries to this PEM file
};
void SetupVerifyCommand(CLI::App& app, RunFn* run);
int RunVerifyCommand(const VerifyOptions& options);

struct RedactCliOptions {
  std::string file;
  std::string drop;  // a comma-separated subset of kRedactItemNames (format/redact.h)
  std::string key;   // private key signing the output
  std::string out;
  bool force = false;  // replace an existing OUT
  TrustOptions trust;
};
void SetupRedactCommand(CLI::App& app, RunFn* run);
int RunRedactCommand(const RedactCliOptions& options);

struct ReportCliOptions {
  std::string file;
  TrustOptions trust;
  std::string format = "md";  // md | html | json
  std::string replay_json;    // `capsule replay --json` output to include; empty: none
  std::string redact;         // a subset of kRedactItemNames, left out of the report
  std::string out;            // empty: stdout
  bool force = false;         // replace an existing OUT
};
void SetupReportCommand(CLI::App& app, RunFn* run);
int RunReportCommand(const ReportCliOptions& options);

struct DiffCliOptions {
  std::string a;
  std::string b;
  TrustOptions trust;
  bool json = false;
};
void SetupDiffCommand(CLI::App& app, RunFn* run);
int RunDiffCommand(const DiffCliOptions& options);

inline constexpr const char kTriageDescription[] =
    "Read every rank's capsules of one data-parallel run: which rank went bad first, who hung "
    "the run, desynced replicas, a gradient reduction that summed";

struct TriageCliOptions {
  std::string dir;
  std::string run_id;  // empty: the only run in DIR
  TrustOptions trust;
  bool json = false;
};
void SetupTriageCommand(CLI::App& app, RunFn* run);
int RunTriageCommand(const TriageCliOptions& options);

// The one-line descriptions of the commands that need LibTorch, shared by the commands and by the
// LibTorch-free `capsule`, which lists them and hands them to capsule-torch (torch_forward.h).
inline constexpr const char kReplayDescription[] =
    "Re-run a capsule: does the failure reproduce, and where do the paths diverge?";
inline constexpr const char kGateDescription[] =
    "Replay every capsule of a folder against the current build: exit 1 if any still fails";
inline constexpr const char kMinimizeDescription[] =
    "Shrink a capsule's batch to the smallest input that still fails the same way, and say what "
    "the failure needs";
inline constexpr const char kStressDescription[] =
    "Run one layer's reference and optimized paths over generated inputs (tile boundaries, "
    "extreme magnitudes, strided layouts), forward and backward: which inputs diverge?";
inline constexpr const char kExtractDescription[] =
    "Write a minimal capsule holding one layer, its weights and its recorded inputs; "
    "`capsule replay` of it runs only that layer (the model's plugin still builds it)";

#ifdef CAPSULE_WITH_TORCH
struct ReplayCliOptions {
  std::string file;
  std::vector<std::string> plugins;
  TrustOptions trust;
  std::string weights;
  std::string checkpoint;  // --checkpoint: where the weights checkpoint the capsule names is
  bool force = false;
  std::string phase = "forward";
  std::string bisect = "bisect";
  bool bisect_given = false;
  std::optional<double> atol;
  std::optional<double> rtol;
  std::vector<std::string> layer_tol;
  bool json = false;
  int repeat = 1;
  std::vector<std::string> features;  // --features: exactly these switches on ("none": all off)
  bool parity = false;                // --parity: whole sequence against the incremental decode
  int64_t prefill = 0;  // --prefill, --chunk: its schedule (0: the capsule's, or half)
  int64_t chunk = 0;
};
void SetupReplayCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunReplayCommand(const ReplayCliOptions& options, ModelRegistry& registry);

struct StressCliOptions {
  std::string file;
  std::string layer;
  std::string phase = "both";
  std::vector<std::string> plugins;
  TrustOptions trust;
  bool force = false;
  bool json = false;
};
void SetupStressCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunStressCommand(const StressCliOptions& options, ModelRegistry& registry);

struct GateCliOptions {
  std::string dir;
  std::vector<std::string> plugins;
  TrustOptions trust;
  bool json = false;
};
void SetupGateCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunGateCommand(const GateCliOptions& options, ModelRegistry& registry);

struct MinimizeCliOptions {
  std::string file;
  std::string key;  // private key signing the minimized capsule
  std::string out;
  bool force = false;
  std::vector<std::string> plugins;
  TrustOptions trust;
  int max_replays = 64;
};
void SetupMinimizeCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunMinimizeCommand(const MinimizeCliOptions& options, ModelRegistry& registry);

struct ExtractCliOptions {
  std::string file;
  std::string layer;
  std::string key;  // private key signing the extract
  std::string out;
  bool force = false;  // replace an existing OUT
  std::vector<std::string> plugins;
  TrustOptions trust;
};
void SetupExtractCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunExtractCommand(const ExtractCliOptions& options, ModelRegistry& registry);
#endif

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_COMMANDS_H_
