#include "capsule/replay/internal/capsule_inputs.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/replay/comparator.h"
#include "capsule/snapshot/hashing.h"
#include "capsule/snapshot/internal/environment.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule::internal {

Status FromTorch(const c10::Error& e, const std::string& what) {
  return InternalError(what + ": " + e.what_without_backtrace());
}

const v1::TensorBlob* FindTensor(const v1::Capsule& c, const std::string& name) {
  for (const auto& t : c.tensors()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

StatusOr<LayerBatch> LoadBatchTensors(const v1::Capsule& c) {
  LayerBatch b;
  b.labels_shifted = c.data().labels_shifted();
  const std::pair<const char*, at::Tensor*> tensors[] = {
      {"input_ids", &b.input_ids}, {"inputs", &b.inputs},
      {"labels", &b.labels},       {"attention_mask", &b.attention_mask},
      {"loss_mask", &b.loss_mask}, {"response_mask", &b.response_mask}};
  for (const auto& [name, dst] : tensors) {
    if (const v1::TensorBlob* t = FindTensor(c, name)) {
      CAPSULE_ASSIGN_OR_RETURN(*dst, TensorFromBlob(*t));
    }
  }
  return b;
}

Status RequireInputIds(const v1::Capsule& c, const LayerBatch& batch) {
  if (batch.ModelInput().defined()) return Status::Ok();
  for (const auto& s : c.data().sequences()) {
    if (!s.token_ids_sha256().empty()) {
      return FailedPreconditionError(
          "the capsule's token ids were redacted (only their SHA-256 is kept), so the step cannot "
          "be re-run; use the unredacted capsule");
    }
  }
  return InvalidArgumentError(
      "the capsule has no input_ids or inputs tensor, so the step cannot be re-run");
}

StatusOr<std::vector<NamedTensor>> ParameterTensors(const v1::Capsule& c) {
  std::vector<NamedTensor> params;
  for (const auto& t : c.tensors()) {
    if (t.role() != v1::PARAMETER) continue;
    CAPSULE_ASSIGN_OR_RETURN(at::Tensor p, TensorFromBlob(t));
    params.emplace_back(t.name(), p);
  }
  return params;
}

Status LoadCapsuleBuffers(const v1::Capsule& c, Model& model) {
  std::vector<NamedTensor> buffers;
  for (const auto& t : c.tensors()) {
    if (t.role() != v1::BUFFER) continue;
    CAPSULE_ASSIGN_OR_RETURN(at::Tensor b, TensorFromBlob(t));
    buffers.emplace_back(t.name(), b);
  }
  if (buffers.empty()) return Status::Ok();
  return model.LoadBuffers(buffers).WithContext("cannot load the capsule's buffers");
}

StatusOr<std::string> ModelHashMismatch(const v1::Capsule& c,
                                        const std::vector<NamedTensor>& params,
                                        const std::string& source) {
  const std::string& recorded = c.identity().model_sha256();
  if (recorded.empty()) return std::string();
  CAPSULE_ASSIGN_OR_RETURN(std::string hash, CanonicalModelHash(params));
  if (hash == recorded) return std::string();
  return "weights from " + source + " have model sha256 " + hash.substr(0, 16) +
         "…, the capsule was recorded with " + recorded.substr(0, 16) + "…";
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

Status PinEnvironment(const v1::Capsule& c, bool force, std::vector<std::string>* warnings) {
  const std::string recorded = c.environment().torch_version();
  if (!recorded.empty() && recorded != TorchVersion()) {
    const std::string msg = "capsule was recorded with torch " + recorded + ", this is torch " +
                            TorchVersion() + "; kernels and RNG streams may differ";
    if (!force) return FailedPreconditionError(msg);
    warnings->push_back(msg);
  }
  const int recorded_threads = c.numerics().intra_op_threads() > 0
                                   ? c.numerics().intra_op_threads()
                                   : c.environment().intra_op_threads();
  if (recorded_threads > 0) {
    // Never more threads than the CPUs this process may use: more only spin (a thread count far
    // beyond them never finishes, and OpenMP ends the process when it cannot start them).
    const int usable = std::min(UsableCpus(), kMaxThreads);
    if (recorded_threads > usable) {
      warnings->push_back("the capsule was recorded with " + std::to_string(recorded_threads) +
                          " intra-op threads; this process may use " + std::to_string(usable) +
                          " CPUs and replays with " + std::to_string(usable) +
                          " threads (reductions split by thread may round differently)");
    }
    at::set_num_threads(std::min(recorded_threads, usable));
  }
  at::globalContext().setDeterministicAlgorithms(c.environment().deterministic_algorithms(),
                                                 /*warn_only=*/false);
  return Status::Ok();
}

TensorList CastTo(const TensorList& xs, at::ScalarType dtype, bool requires_grad) {
  TensorList out;
  out.reserve(xs.size());
  for (const at::Tensor& x : xs) {
    if (!x.defined() || !x.is_floating_point()) {
      out.push_back(x.defined() ? x.detach() : x);
      continue;
    }
    at::Tensor y = x.detach().to(dtype).clone();
    if (requires_grad) y.set_requires_grad(true);
    out.push_back(y);
  }
  return out;
}

void FillComparison(const TensorComparison& t, v1::LayerComparison* out) {
  out->set_max_abs_err(t.max_abs_err);
  out->set_max_rel_err(t.max_rel_err);
  out->set_rms_err_rel(t.rms_err_rel);
  out->set_cosine(t.cosine);
  out->set_nonfinite_mismatch(t.nonfinite_mismatch);
  out->set_failed(t.failed);
  out->set_numel(t.numel);
  out->set_fail_fraction(t.fail_fraction);
  out->set_atol_applied(t.atol_applied);
  out->set_worst_ratio(t.worst_ratio);
  out->set_atol(t.tolerance_used.atol);
  out->set_rtol(t.tolerance_used.rtol);
  if (t.top1_agreement) out->set_top1_agreement(*t.top1_agreement);
  out->set_verdict(t.diverged ? v1::DIVERGED : v1::OK);
  out->set_reason(t.reason);
}

}  // namespace capsule::internal
