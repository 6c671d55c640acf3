#include "capsule/capture/internal/capture_writer.h"

#include <filesystem>

#include "capsule/base/internal/file_util.h"
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

std::string FreeCapturedCapsulePath(const v1::Capsule& capsule, const MonitorOptions& options) {
  const std::string base = CapturedCapsulePath(capsule, options);
  for (int n = 1; n <= kMaxSameNameCapsules; ++n) {
    std::error_code ec;
    const std::string path = SameNameSibling(base, n);
    if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return path;
  }
  return base;
}

StatusOr<std::string> WriteCapturedCapsule(const v1::Capsule& capsule,
                                           const MonitorOptions& options, const PrivateKey* key,
                                           const TensorDataViews* tensor_data) {
  CAPSULE_RETURN_IF_ERROR(MakeDirs(options.capsule_dir, "capsule directory"));
  const std::string base = CapturedCapsulePath(capsule, options);
  WriteOptions wopts;
  wopts.signing_key = key;
  if (capsule.model().weight_policy() == v1::WEIGHTS_ALL) {
    wopts.optional_flags |= kOptionalFlagHasWeights;
  }
  wopts.verify_tensor_digests = false;
  if (tensor_data != nullptr && !tensor_data->empty()) wopts.tensor_data = tensor_data;
  // Two captures of one kind in one step (a trigger and a capture by hand, or the rate limit set
  // to 0), or a run restarted into the same folder, name the same file: the later one takes the
  // next free "-N" name. The move refuses a taken name atomically, so no capsule replaces another.
  Status last = Status::Ok();
  for (int n = 1; n <= kMaxSameNameCapsules; ++n) {
    const std::string path = SameNameSibling(base, n);
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
      last = Status(StatusCode::kAlreadyExists, path + " already exists");
      continue;  // taken: not worth encoding for
    }
    last = WriteCapsuleFile(path, capsule, wopts);
    if (last.code() != StatusCode::kAlreadyExists) {
      if (!last.ok()) return last;
      return path;
    }
  }
  return last.WithContext(std::to_string(kMaxSameNameCapsules) + " capsules of this name exist");
}

std::string SameNameSibling(const std::string& path, int n) {
  if (n <= 1) return path;
  const std::string suffix = ".capsule";
  const bool has = path.size() >= suffix.size() &&
                   path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string stem = has ? path.substr(0, path.size() - suffix.size()) : path;
  return stem + "-" + std::to_string(n) + (has ? suffix : "");
}

}  // namespace capsule::internal
