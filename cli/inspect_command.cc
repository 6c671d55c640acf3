#include "capsule/cli/inspect_command.h"

#include <iostream>
#include <sstream>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/base/internal/strings.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/json.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/report/inspect_text.h"

namespace capsule::cli {
namespace {

std::string EnvelopeJson(const EnvelopeInfo& e) {
  std::ostringstream os;
  os << "{\"format_version\":\"" << e.header.major << "." << e.header.minor << "\""
     << ",\"header_size\":" << e.header.header_size
     << ",\"required_flags\":" << e.header.required_flags
     << ",\"optional_flags\":" << e.header.optional_flags
     << ",\"payload_size\":" << e.header.payload_size
     << ",\"uncompressed_size\":" << e.header.uncompressed_size << ",\"file_size\":" << e.file_size
     << ",\"signature_algorithm\":\""
     << (e.signature_algorithm == kSigAlgEd25519 ? "ed25519" : "none") << "\""
     << ",\"signature\":\"" << SignatureStateName(e.signature) << "\""
     << ",\"signer_key_id\":"
     << (e.signature_algorithm == kSigAlgNone ? "null" : "\"" + HexEncode(e.key_id) + "\"")
     << ",\"signer_key\":"
     << (e.signer_key.empty() ? "null" : "\"" + HexEncode(e.signer_key) + "\"") << ",\"digest\":\""
     << HexEncode(e.digest) << "\"}";
  return os.str();
}

}  // namespace

void SetupInspectCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show what a capsule holds");
  cmd->add_option("file", options->file, "Capsule file")->required();
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kShow);
  cmd->add_flag("--json", options->json,
                "Print the capsule as JSON (protobuf's JSON mapping) plus an \"envelope\" object");
  cmd->add_flag("--full", options->full, "With --json, include tensor bytes (base64)");
  cmd->callback([options, run] { *run = [options] { return RunInspectCommand(*options); }; });
}

int RunInspectCommand(const InspectOptions& options) {
  // Without --pubkey the user asked to look, not to trust: every signed capsule is shown, with
  // its trust stated.
  int rc = kExitError;
  std::optional<CommandInput> input =
      OpenCommandInput({options.file, options.trust, "", nullptr}, &rc);
  if (!input) return rc;
  LoadedCapsule* loaded = &input->capsule;
  DecodedCapsule* decoded = &loaded->decoded;
  if (!options.json) {
    std::cout << RenderInspectSummary(options.file, *decoded);
    return kExitOk;
  }
  v1::Capsule& c = *decoded->capsule;
  if (!options.full) {
    for (auto& t : *c.mutable_tensors()) t.clear_data();  // sha256 and meta still identify them
  }
  const std::string body = MessageToJson(c, JsonDefaults::kOmitted);
  // Splice the envelope, with how far this reading trusts the capsule, in as the first member of
  // the capsule's own object.
  const std::string trust = MessageToJson(loaded->trust);
  std::string envelope = EnvelopeJson(decoded->envelope);
  envelope.insert(envelope.size() - 1, ",\"trust\":" + trust);
  std::string out = "{\"envelope\":" + envelope;
  out += body.size() > 2 ? "," + body.substr(1) : "}";
  std::cout << out << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
