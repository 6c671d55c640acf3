#include "capsule/capture/internal/capture_writer.h"

#include "capsule/base/file_util.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"

namespace capsule::internal {

StatusOr<std::optional<PrivateKey>> LoadCaptureKey(const std::string& path) {
  if (path.empty()) return std::optional<PrivateKey>();
  auto key = LoadPrivateKeyFile(path);
  if (!key.ok()) return key.status().WithContext("signing key");
  return std::optional<PrivateKey>(std::move(*key));
}

StatusOr<std::string> WriteCapturedCapsule(const v1::Capsule& capsule,
                                           const MonitorOptions& options, const PrivateKey* key) {
  CAPSULE_RETURN_IF_ERROR(MakeDirs(options.capsule_dir, "capsule directory"));
  const TriggerKind kind = static_cast<TriggerKind>(capsule.trigger().kind());
  const std::string path = options.capsule_dir + "/" +
                           CapsuleFileName(options.run_name, capsule.step().global_step(),
                                           options.rank, TriggerKindName(kind));
  WriteOptions wopts;
  wopts.signing_key = key;
  if (capsule.model().weight_policy() == v1::WEIGHTS_ALL) {
    wopts.optional_flags |= kOptionalFlagHasWeights;
  }
  CAPSULE_RETURN_IF_ERROR(WriteCapsuleFile(path, capsule, wopts));
  return path;
}

}  // namespace capsule::internal
