// Deterministic sample capsules: a minimal one and a full-featured one with every field of
// capsule.proto set. The golden-sample generator writes them (and invalid variants) to
// samples/golden/; tests and benchmarks build on them. Timestamps and contents are fixed, so the
// same library version always produces the same bytes.
//
//   capsule::v1::Capsule c = capsule::golden::MakeFullCapsule();
//   CAPSULE_ASSIGN_OR_RETURN(std::string bytes, capsule::EncodeCapsule(c, options));
//
// Thread safety: thread-safe.
#ifndef CAPSULE_SAMPLES_GOLDEN_GOLDEN_CAPSULES_H_
#define CAPSULE_SAMPLES_GOLDEN_GOLDEN_CAPSULES_H_

#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule::golden {

v1::Capsule MakeMinimalCapsule();
v1::Capsule MakeFullCapsule();

// Sets every field of a rank's Distributed section (two collectives, a reduction, a fingerprint,
// the agreement and a thread position), with times from `time_base` (unix microseconds).
void FillDistributed(v1::Distributed* dist, int64_t time_base);
// Sets every field of a Generation section (a generation step's prompt, sampling and cache).
void FillGeneration(v1::Generation* gen);

// A TensorBlob named `name` holding `values` as float32, with meta and sha256 filled in.
v1::TensorBlob MakeFloatBlob(const std::string& name, const std::vector<int64_t>& shape,
                             const std::vector<float>& values);

// Reads a PEM private key without the 0600 mode check: the TEST-ONLY sample keys lose their mode
// in git. Never use this for a real key.
StatusOr<PrivateKey> LoadTestOnlyKey(const std::string& path);

struct GoldenFile {
  std::string name;  // relative path, e.g. "invalid/truncated.capsule"
  std::string bytes;
  StatusCode expected;  // what DecodeCapsule with the default limits and the test key returns
};

// All golden files, valid and invalid, signed with `key` (and `other` for the wrong-signer case).
StatusOr<std::vector<GoldenFile>> MakeGoldenFiles(const PrivateKey& key, const PrivateKey& other);

}  // namespace capsule::golden

#endif  // CAPSULE_SAMPLES_GOLDEN_GOLDEN_CAPSULES_H_
