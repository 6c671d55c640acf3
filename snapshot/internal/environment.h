// The environment fingerprint: what can change a step's numbers without changing its inputs —
// torch version and build config, compiler, OS, CPU model and vector flags, BLAS, intra-op thread
// count (reductions and GEMM blocking depend on it), deterministic-algorithms flag, library
// versions, CUDA devices, host name.
//
//   v1::Environment env;
//   capsule::CollectEnvironment(&env);
//
// Thread safety: thread-safe.
#ifndef CAPSULE_SNAPSHOT_INTERNAL_ENVIRONMENT_H_
#define CAPSULE_SNAPSHOT_INTERNAL_ENVIRONMENT_H_

#include <string>

namespace capsule::v1 {
class Environment;
}  // namespace capsule::v1

namespace capsule {

void CollectEnvironment(v1::Environment* env);

// Records `name` at `version` in every environment collected from now on in this process (its
// `libraries` map), beside the libraries the engine links: the Python package adds "python" and
// the interpreter's version when it loads, so that a capsule says it was written from Python and
// how to replay it (report/replay_tool.h).
void AddEnvironmentLibrary(const std::string& name, const std::string& version);

// "1.13.0": the LibTorch version this library was built against.
std::string TorchVersion();

}  // namespace capsule

#endif  // CAPSULE_SNAPSHOT_INTERNAL_ENVIRONMENT_H_
