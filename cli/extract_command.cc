#include "capsule/cli/extract_command.h"

#include <iostream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/replay/extract.h"

namespace capsule::cli {

void SetupExtractCommand(CLI::App& app, RunFn* run, ModelRegistry* registry) {
  auto options = std::make_shared<ExtractCliOptions>();
  CLI::App* cmd = app.add_subcommand("extract", kExtractDescription);
  cmd->add_option("file", options->file, "Capsule file (with all weights embedded)")->required();
  cmd->add_option("--layer", options->layer, "Layer to extract, e.g. blocks.6")->required();
  cmd->add_option("--key", options->key, "Private key (PEM, mode 0600) to sign the extract with")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", options->out, "Output capsule file")->required();
  AddForceOption(cmd, &options->force);
  AddPluginOption(cmd, &options->plugins);
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->callback([options, run, registry] {
    *run = [options, registry] { return RunExtractCommand(*options, *registry); };
  });
}

int RunExtractCommand(const ExtractCliOptions& o, ModelRegistry& registry) {
  int rc = kExitError;
  std::optional<CommandInput> input =
      OpenCommandInput({o.file, o.trust, o.key, PluginModels(o.plugins, registry)}, &rc);
  if (!input) return rc;
  const LoadedCapsule* loaded = &input->capsule;
  auto extract = ExtractLayer(*loaded->decoded.capsule, registry, {o.layer, loaded->sha256});
  if (!extract.ok()) {
    PrintError(extract.status(),
               RerunRemedy(extract.status(), RerunFactsOf(*loaded->decoded.capsule, registry)));
    return kExitError;
  }
  auto bytes =
      EncodeDerived(*loaded, "extract", *input->key,
                    kOptionalFlagExtract |
                        (loaded->decoded.envelope.header.optional_flags & kOptionalFlagRedacted),
                    &*extract);
  if (!bytes.ok()) {
    PrintError(bytes.status());
    return kExitError;
  }
  if (!WriteOutputFile(o.file, o.out, *bytes, o.force)) return kExitError;
  std::cout << "wrote " << Printable(o.out) << " (layer " << Printable(o.layer) << ")\n";
  return kExitOk;
}

}  // namespace capsule::cli
