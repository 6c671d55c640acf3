#include "capsule/cli/inspect_command.h"

#include <iostream>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/base/internal/strings.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/json.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/report.pb.h"
#include "capsule/report/inspect_text.h"

namespace capsule::cli {
namespace {

v1::EnvelopeView EnvelopeMessage(const EnvelopeInfo& e, const v1::InputTrust& trust) {
  v1::EnvelopeView v;
  v.set_format_version(std::to_string(e.header.major) + "." + std::to_string(e.header.minor));
  v.set_header_size(e.header.header_size);
  v.set_required_flags(e.header.required_flags);
  v.set_optional_flags(e.header.optional_flags);
  v.set_payload_size(e.header.payload_size);
  v.set_uncompressed_size(e.header.uncompressed_size);
  v.set_file_size(e.file_size);
  v.set_signature_algorithm(e.signature_algorithm == kSigAlgEd25519 ? "ed25519" : "none");
  v.set_signature(SignatureStateName(e.signature));
  if (e.signature_algorithm != kSigAlgNone) v.set_signer_key_id(HexEncode(e.key_id));
  if (!e.signer_key.empty()) v.set_signer_key(HexEncode(e.signer_key));
  v.set_digest(HexEncode(e.digest));
  *v.mutable_trust() = trust;
  return v;
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
  // The capsule as it was written, with its envelope (and how far this reading trusts it) first.
  std::cout << MessageToJsonWithFirst("envelope", EnvelopeMessage(decoded->envelope, loaded->trust),
                                      c, JsonDefaults::kOmitted)
            << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
