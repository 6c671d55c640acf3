#include <google/protobuf/util/json_util.h>

#include <iostream>
#include <sstream>

#include "capsule/base/sha256.h"
#include "capsule/base/strings.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/commands.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/proto/capsule.pb.h"

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
     << ",\"digest\":\"" << HexEncode(e.digest) << "\"}";
  return os.str();
}

void PrintSummary(const std::string& file, const DecodedCapsule& d, std::ostream& out) {
  const v1::Capsule& c = *d.capsule;
  const EnvelopeInfo& e = d.envelope;
  out << "capsule " << file << "\n";
  out << "  format " << e.header.major << "." << e.header.minor << ", " << e.file_size
      << " bytes (payload " << e.header.payload_size << " bytes zstd, "
      << e.header.uncompressed_size << " uncompressed)\n";
  out << "  signature: " << SignatureStateName(e.signature);
  if (e.signature_algorithm != kSigAlgNone) out << ", ed25519 key " << HexEncode(e.key_id);
  out << "\n";
  out << "  written by capsule " << c.writer_version() << " at "
      << FormatUnixMicrosUtc(c.created_unix_micros()) << ", run \"" << c.run_name() << "\"\n";

  const v1::Trigger& t = c.trigger();
  out << "trigger: " << v1::TriggerKind_Name(t.kind()) << " at step " << c.step().global_step()
      << " (observed " << FormatSignificant(t.observed(), 6);
  if (t.threshold() != 0) out << ", threshold " << FormatSignificant(t.threshold(), 6);
  out << ")\n";
  if (!t.rule().empty()) out << "  rule: " << t.rule() << "\n";
  if (!t.message().empty()) out << "  message: " << t.message() << "\n";
  if (t.capture_rerun() != v1::REPRODUCTION_UNSPECIFIED) {
    out << "  capture re-run: " << v1::Reproduction_Name(t.capture_rerun()) << " (observed "
        << FormatSignificant(t.rerun_observed(), 6) << ")\n";
  }
  if (c.step().history_size() > 0) {
    out << "  history: " << c.step().history_size() << " steps, " << c.step().history(0).step()
        << ".." << c.step().history(c.step().history_size() - 1).step() << "\n";
  }

  if (!c.model().registry_name().empty()) {
    out << "model: " << c.model().registry_name() << " ("
        << (c.model().trainer_path() == v1::REFERENCE ? "reference" : "optimized") << " path), "
        << c.model().layers_size() << " layers\n";
  }
  const v1::Numerics& n = c.numerics();
  if (!n.first_anomalous_layer().empty()) {
    out << "first anomalous layer: " << n.first_anomalous_layer() << " (" << n.anomaly_reason()
        << ")\n";
  } else if (n.layers_size() > 0) {
    out << "first anomalous layer: none\n";
  }
  if (n.layers_size() > 0) out << "layer stats: " << n.layers_size() << " entries\n";

  const v1::DataBatch& data = c.data();
  if (data.sequences_size() > 0) {
    int64_t tokens = 0;
    for (const auto& s : data.sequences()) {
      tokens += s.token_ids_size() > 0 ? s.token_ids_size() : s.token_count();
    }
    out << "data: " << data.sequences_size() << " sequences, " << tokens << " tokens; cursor epoch "
        << data.cursor().epoch() << " shard " << data.cursor().shard() << " offset "
        << data.cursor().offset() << "\n";
  }
  if (c.rng().generators_size() > 0) {
    out << "rng:";
    for (const auto& g : c.rng().generators()) out << " " << g.name();
    out << "\n";
  }
  if (c.tensors_size() > 0) {
    uint64_t bytes = 0;
    for (const auto& tb : c.tensors()) bytes += tb.data().size();
    out << "tensors: " << c.tensors_size() << " embedded, " << HumanBytes(bytes) << "\n";
  }
  const v1::Identity& id = c.identity();
  if (!id.model_sha256().empty()) out << "model sha256: " << id.model_sha256() << "\n";
  for (const auto& f : id.files()) {
    out << "  " << f.role() << " " << f.name() << " sha256 " << f.sha256() << "\n";
  }
  const v1::Environment& env = c.environment();
  if (!env.torch_version().empty() || !env.compiler().empty()) {
    out << "environment: torch " << (env.torch_version().empty() ? "-" : env.torch_version())
        << ", " << env.intra_op_threads() << " intra-op threads, " << env.compiler() << ", "
        << env.os() << "\n";
  }
  if (c.redaction().dropped_size() > 0) {
    out << "redacted:";
    for (const auto& r : c.redaction().dropped()) out << " " << r;
    out << "\n";
  }
}

}  // namespace

void SetupInspectCommand(CLI::App& app, RunFn* run) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show what a capsule holds");
  cmd->add_option("file", options->file, "Capsule file")->required();
  AddTrustOptions(cmd, &options->trust);
  cmd->add_flag("--json", options->json,
                "Print the capsule as JSON (protobuf's JSON mapping) plus an \"envelope\" object");
  cmd->add_flag("--full", options->full, "With --json, include tensor bytes (base64)");
  cmd->callback([options, run] { *run = [options] { return RunInspectCommand(*options); }; });
}

int RunInspectCommand(const InspectOptions& options) {
  // Without --pubkey the user asked to look, not to trust: with --allow-unsigned the signature is
  // reported as not checked instead of refused.
  int rc = kExitError;
  std::optional<LoadedCapsule> loaded =
      LoadCapsule(options.file, options.trust.pubkeys, options.trust.allow_unsigned, &rc);
  if (!loaded) return rc;
  DecodedCapsule* decoded = &loaded->decoded;
  if (!options.json) {
    PrintSummary(options.file, *decoded, std::cout);
    return kExitOk;
  }
  v1::Capsule& c = *decoded->capsule;
  if (!options.full) {
    for (auto& t : *c.mutable_tensors()) t.clear_data();  // sha256 and meta still identify them
  }
  google::protobuf::util::JsonPrintOptions jopts;
  jopts.preserve_proto_field_names = true;
  std::string body;
  auto st = google::protobuf::util::MessageToJsonString(c, &body, jopts);
  if (!st.ok()) {
    std::cerr << "capsule: cannot render JSON: " << st.ToString() << "\n";
    return kExitError;
  }
  // Splice the envelope in as the first member of the capsule's own object.
  std::string out = "{\"envelope\":" + EnvelopeJson(decoded->envelope);
  out += body.size() > 2 ? "," + body.substr(1) : "}";
  std::cout << out << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
