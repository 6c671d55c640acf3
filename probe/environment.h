// The environment fingerprint: what can change a step's numbers without changing its inputs —
// torch version and build config, compiler, OS, CPU model and vector flags, BLAS, intra-op thread
// count (reductions and GEMM blocking depend on it), deterministic-algorithms flag, library
// versions, CUDA devices, host name.
//
//   v1::Environment env;
//   capsule::CollectEnvironment(&env);
//
// Thread safety: thread-safe.
#ifndef CAPSULE_PROBE_ENVIRONMENT_H_
#define CAPSULE_PROBE_ENVIRONMENT_H_

#include <string>

namespace capsule::v1 {
class Environment;
}  // namespace capsule::v1

namespace capsule {

void CollectEnvironment(v1::Environment* env);

// "1.13.0": the LibTorch version this library was built against.
std::string TorchVersion();

}  // namespace capsule

#endif  // CAPSULE_PROBE_ENVIRONMENT_H_
