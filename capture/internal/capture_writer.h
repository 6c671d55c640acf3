// Capture writer: the disk side of a capture. The signing key is loaded before anything else (a
// capture that cannot be signed as asked is refused before the re-run spends time on it); the
// built capsule is then written into the capsule directory under its conventional name,
// atomically (format/capsule_writer.h).
//
//   CAPSULE_ASSIGN_OR_RETURN(std::optional<PrivateKey> key,
//                            internal::LoadCaptureKey(options.signing_key_path));
//   ... build the capsule ...
//   CAPSULE_ASSIGN_OR_RETURN(std::string path,
//                            internal::WriteCapturedCapsule(capsule, options, key ? &*key :
//                            nullptr));
//
// Thread safety: thread-safe; two writers of the same step, rank and trigger race for the name.
#ifndef CAPSULE_CAPTURE_INTERNAL_CAPTURE_WRITER_H_
#define CAPSULE_CAPTURE_INTERNAL_CAPTURE_WRITER_H_

#include <optional>
#include <string>

#include "capsule/base/status.h"
#include "capsule/capture/monitor.h"
#include "capsule/format/signing.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::internal {

// The PEM Ed25519 private key at `path` (mode 0600); nullopt for an empty path (capsules are
// written unsigned). The codes of LoadPrivateKeyFile, with the context "signing key".
StatusOr<std::optional<PrivateKey>> LoadCaptureKey(const std::string& path);

// The name of `capsule`'s file: options.capsule_dir/CapsuleFileName(...), taken or not.
std::string CapturedCapsulePath(const v1::Capsule& capsule, const MonitorOptions& options);

// Where WriteCapturedCapsule would put `capsule` now: CapturedCapsulePath, or its first free
// SameNameSibling when that is taken (a writer that gets there first takes the next one).
std::string FreeCapturedCapsulePath(const v1::Capsule& capsule, const MonitorOptions& options);

// How many capsules of one name a folder may hold ("x.capsule", "x-2.capsule", ...).
inline constexpr int kMaxSameNameCapsules = 1000;

// The n-th capsule of one name: `path` for n <= 1, else its stem + "-n" + ".capsule".
std::string SameNameSibling(const std::string& path, int n);

// Creates options.capsule_dir with its parents and writes `capsule` there as
// <run>-step<N>-rank<R>-<trigger>.capsule (step and trigger from the capsule; a taken name: the
// first free SameNameSibling, claimed by the atomic move), signed with `key`
// when it is not null, flagged as holding every weight when its weight policy is ALL. Tensor
// bytes held outside the message come as `tensor_data` (BuiltCapsule::tensor_data: one entry
// per tensor; null or empty: every byte is in the message). The tensors' digests are not computed
// again: the builder has just hashed these very bytes. Returns the path. The codes of MakeDirs
// and WriteCapsuleFile.
StatusOr<std::string> WriteCapturedCapsule(const v1::Capsule& capsule,
                                           const MonitorOptions& options, const PrivateKey* key,
                                           const TensorDataViews* tensor_data = nullptr);

}  // namespace capsule::internal

#endif  // CAPSULE_CAPTURE_INTERNAL_CAPTURE_WRITER_H_
