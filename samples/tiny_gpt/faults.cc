#include "samples/tiny_gpt/faults.h"

#include <ATen/ATen.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <utility>

namespace capsule::tiny_gpt {
namespace {

constexpr std::array<std::pair<FaultKind, const char*>, 26> kKindNames = {{
    {FaultKind::kNone, "none"},
    {FaultKind::kNan, "nan"},
    {FaultKind::kSoftmaxOverflow, "softmax-overflow"},
    {FaultKind::kTailBlock, "tail-block"},
    {FaultKind::kEps, "eps"},
    {FaultKind::kBadData, "bad-data"},
    {FaultKind::kTransient, "transient"},
    {FaultKind::kLossSum, "loss-sum"},
    {FaultKind::kLabelsUnshifted, "labels-unshifted"},
    {FaultKind::kBadBatch, "bad-batch"},
    {FaultKind::kDisconnected, "disconnected"},
    {FaultKind::kPadInLoss, "pad-in-loss"},
    {FaultKind::kAccumScale, "accum-scale"},
    {FaultKind::kFrozenUpdated, "frozen-updated"},
    {FaultKind::kDecayOnNorm, "decay-on-norm"},
    {FaultKind::kStepOnOverflow, "step-on-overflow"},
    {FaultKind::kClipBeforeUnscale, "clip-before-unscale"},
    {FaultKind::kGeluGrad, "gelu-grad"},
    {FaultKind::kMaskOffset, "mask-offset"},
    {FaultKind::kRopeDecode, "rope-decode-position"},
    {FaultKind::kRerotatedKey, "rerotated-key"},
    {FaultKind::kGqaDecodeMap, "gqa-decode-map"},
    {FaultKind::kLeftPadPositions, "left-pad-positions"},
    {FaultKind::kDropoutInEval, "dropout-in-eval"},
    {FaultKind::kBf16Merge, "bf16-merge"},
    {FaultKind::kMergeTwice, "merge-twice"},
}};

bool KindNeedsLayer(FaultKind kind) {
  return kind != FaultKind::kNone && kind != FaultKind::kBadData && kind != FaultKind::kBadBatch &&
         kind != FaultKind::kLossSum && kind != FaultKind::kLabelsUnshifted &&
         kind != FaultKind::kPadInLoss && kind != FaultKind::kAccumScale &&
         kind != FaultKind::kDecayOnNorm && kind != FaultKind::kClipBeforeUnscale &&
         kind != FaultKind::kLeftPadPositions;
}

}  // namespace

const char* FaultKindName(FaultKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

StatusOr<FaultKind> ParseFaultKind(std::string_view name) {
  for (const auto& [kind, spelled] : kKindNames) {
    if (name == spelled) return kind;
  }
  return InvalidArgumentError(
      "tiny_gpt: unknown fault kind '" + std::string(name) +
      "' (use none, nan, softmax-overflow, tail-block, eps, bad-data, bad-batch, transient, "
      "loss-sum, labels-unshifted, disconnected, pad-in-loss, accum-scale, frozen-updated, "
      "decay-on-norm, step-on-overflow, clip-before-unscale, gelu-grad, mask-offset, "
      "rope-decode-position, rerotated-key, gqa-decode-map, left-pad-positions, "
      "dropout-in-eval, bf16-merge or merge-twice)");
}

std::string FaultSpec::ToString() const {
  std::string text = FaultKindName(kind);
  if (kind == FaultKind::kNone) return text;
  if (KindNeedsLayer(kind)) text += ":" + layer;
  return text + "@" + std::to_string(from_step);
}

StatusOr<FaultSpec> ParseFaultSpec(std::string_view text) {
  FaultSpec spec;
  std::string_view rest = text;
  const size_t at = rest.find('@');
  if (at != std::string_view::npos) {
    const std::string step_text(rest.substr(at + 1));
    char* end = nullptr;
    errno = 0;
    const long long step = std::strtoll(step_text.c_str(), &end, 10);
    if (step_text.empty() || *end != '\0' || errno != 0 || step < 0) {
      return InvalidArgumentError("tiny_gpt: bad fault step in '" + std::string(text) +
                                  "' (want KIND[:LAYER][@STEP] with STEP >= 0)");
    }
    spec.from_step = step;
    rest = rest.substr(0, at);
  }
  const size_t colon = rest.find(':');
  CAPSULE_ASSIGN_OR_RETURN(spec.kind, ParseFaultKind(rest.substr(0, colon)));
  if (colon != std::string_view::npos) spec.layer = std::string(rest.substr(colon + 1));
  if (KindNeedsLayer(spec.kind) && spec.layer.empty()) {
    return InvalidArgumentError("tiny_gpt: fault '" + std::string(text) + "' needs a layer (e.g. " +
                                FaultKindName(spec.kind) + ":blocks.1@0)");
  }
  if (!KindNeedsLayer(spec.kind) && !spec.layer.empty()) {
    return InvalidArgumentError("tiny_gpt: fault '" + std::string(text) +
                                "' takes no layer (drop ':" + spec.layer + "')");
  }
  return spec;
}

bool FaultCorruptsBatch(const FaultSpec& fault, int64_t step) {
  return (fault.kind == FaultKind::kBadData || fault.kind == FaultKind::kBadBatch) &&
         step == fault.from_step;
}

void CorruptBatch(LayerBatch& batch, bool every_sample) {
  at::Tensor labels = batch.labels.clone();
  at::Tensor row = every_sample ? labels : labels[kCorruptSample];
  row.copy_(at::where(row.eq(-100), row, at::bitwise_xor(row, 0x80)));
  batch.labels = labels;
}

bool TrainerFaultActive(const FaultSpec& fault, FaultKind kind, int64_t step) {
  if (fault.kind != kind) return false;
  return kind == FaultKind::kStepOnOverflow ? step == fault.from_step : step >= fault.from_step;
}

bool FaultUnshiftsLabels(const FaultSpec& fault, int64_t step) {
  return fault.kind == FaultKind::kLabelsUnshifted && step >= fault.from_step;
}

void UnshiftLabels(LayerBatch& batch) {
  batch.labels = at::where(batch.labels.eq(-100), batch.labels, batch.input_ids);
}

}  // namespace capsule::tiny_gpt
