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

std::string CapturedCapsulePath(const v1::Capsule& capsule, const MonitorOptions& options) {
  const TriggerKind kind = static_cast<TriggerKind>(capsule.trigger().kind());
  return options.capsule_dir + "/" +
         CapsuleFileName(options.run_name, capsule.step().global_step(), options.rank,
                         TriggerKindName(kind));
}

StatusOr<std::string> WriteCapturedCapsule(const v1::Capsule& capsule,
                                           const MonitorOptions& options, const PrivateKey* key,
                                           const TensorDataViews* tensor_data) {
  CAPSULE_RETURN_IF_ERROR(MakeDirs(options.capsule_dir, "capsule directory"));
  const std::string path = CapturedCapsulePath(capsule, options);
  WriteOptions wopts;
  wopts.signing_key = key;
  if (capsule.model().weight_policy() == v1::WEIGHTS_ALL) {
    wopts.optional_flags |= kOptionalFlagHasWeights;
  }
  wopts.verify_tensor_digests = false;
  if (tensor_data != nullptr && !tensor_data->empty()) wopts.tensor_data = tensor_data;
  CAPSULE_RETURN_IF_ERROR(WriteCapsuleFile(path, capsule, wopts));
  return path;
}

}  // namespace capsule::internal
