// The commands a report tells its reader to run, and the flags they use. The flags are spelled
// once, here: the CLI declares its options with the same constants (cli/common.cc), so a report
// never names a flag the tool does not have.
//
// How a capsule is replayed: the command that can run its model. A capsule written by a C++
// trainer replays with `capsule` and the model's plugin; one written from the Python package
// (its environment lists "python", snapshot/internal/environment.h) with `python3 -P -m capsule`
// and the factory that rebuilds the model. Reports, triage and replay's own "replay:" line print
// it.
//
//   const ReplayTool tool = ReplayToolFor(capsule);
//   std::cout << tool.program << " replay " << file << " " << tool.model_args << "\n";
//
// Thread safety: pure functions.
#ifndef CAPSULE_REPORT_REPLAY_TOOL_H_
#define CAPSULE_REPORT_REPLAY_TOOL_H_

#include <string>

#include "capsule/format/capsule_fwd.h"

namespace capsule {

namespace flags {
inline constexpr char kPubkey[] = "--pubkey";  // a trusted public key (PEM)
inline constexpr char kAllowUntrusted[] = "--allow-untrusted";
inline constexpr char kAllowUnsigned[] = "--allow-unsigned";
inline constexpr char kRedact[] = "--redact";  // leave a capture section out
}  // namespace flags

// "--pubkey SIGNER.pub": the argument that names the key a reader trusts.
std::string PubkeyArgument();

struct ReplayTool {
  std::string program;     // "capsule" or "python3 -P -m capsule"
  std::string model_args;  // "--plugin <model plugin>" or "--model <pkg.module:factory>"
};

// Whether the Python package wrote `capsule` (its environment's libraries name "python").
bool WrittenFromPython(const v1::Capsule& capsule);

ReplayTool ReplayToolFor(const v1::Capsule& capsule);

}  // namespace capsule

#endif  // CAPSULE_REPORT_REPLAY_TOOL_H_
