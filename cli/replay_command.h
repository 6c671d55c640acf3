// capsule replay: re-runs a capsule's step on the optimized and reference paths: the diagnosis,
// fidelity, the divergent layers and their bisect. Needs LibTorch: defined in capsule-torch; the
// LibTorch-free `capsule` lists the command by its description and hands it on (torch_forward.h).
// Internal to the CLI.
#ifndef CAPSULE_CLI_REPLAY_COMMAND_H_
#define CAPSULE_CLI_REPLAY_COMMAND_H_

#include <optional>
#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule {
class ModelRegistry;
}  // namespace capsule

namespace capsule::cli {

inline constexpr const char kReplayDescription[] =
    "Re-run a capsule: does the failure reproduce, and where do the paths diverge?";

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
  std::string adapter_merge;  // --adapter-merge: float32 or bfloat16 (empty: the capsule's)
};
void SetupReplayCommand(CLI::App& app, RunFn* run, ModelRegistry* registry);
int RunReplayCommand(const ReplayCliOptions& options, ModelRegistry& registry);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_REPLAY_COMMAND_H_
