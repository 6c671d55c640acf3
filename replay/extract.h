// Layer extracts: a minimal standalone capsule holding one layer (`capsule extract`).
//
// An extract keeps, of a full capsule, the model spec, the trigger, step, environment, identity
// and placement, and for one layer: its REFERENCE input (computed here by running the full
// capsule's reference path, FP64, up to that layer — the input the full replay's layerwise
// comparison feeds it), its parameters, and when the source has them the captured optimized-path
// input and output of that layer. Everything else (other weights, token ids, texts, RNG, logs)
// is dropped. It is marked by annotations "extract.layer", "extract.index" and
// "extract.source_sha256", model.layers = {layer}, and the envelope's kOptionalFlagExtract.
//
// ReplayExtract runs that one layer on both paths and compares them with the comparator of the
// full replay, so an extract reproduces the full replay's verdict and errors for its layer.
//
//   capsule::ExtractOptions options{"blocks.6", capsule::Sha256Hex(file_bytes)};
//   CAPSULE_ASSIGN_OR_RETURN(capsule::v1::Capsule x,
//                            capsule::ExtractLayer(full, registry, options));
//
// Thread safety: like replay, one at a time per process (sets LibTorch's global thread count).
#ifndef CAPSULE_REPLAY_EXTRACT_H_
#define CAPSULE_REPLAY_EXTRACT_H_

#include <string>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/replay/model_registry.h"
#include "capsule/replay/replayer.h"

namespace capsule {

inline constexpr char kExtractLayerKey[] = "extract.layer";
inline constexpr char kExtractIndexKey[] = "extract.index";
inline constexpr char kExtractSourceKey[] = "extract.source_sha256";

struct ExtractOptions {
  // The layer to keep, as named in model.layers ("blocks.6"). Required.
  std::string layer;
  // SHA-256 (hex) of the full capsule's file, recorded in the extract. Required.
  std::string source_sha256;
};

// kInvalidArgument: no such layer, no input_ids, or the capsule is itself an extract;
// kFailedPrecondition: the capsule does not embed all weights (needed for the reference input),
// its token ids were redacted, or its torch version differs (the reference input would not be the
// one the full replay computes); kNotFound: model not registered.
StatusOr<v1::Capsule> ExtractLayer(const v1::Capsule& full, const ModelRegistry& registry,
                                   const ExtractOptions& options);

// Whether `capsule` is a layer extract (has the "extract.layer" annotation).
bool IsLayerExtract(const v1::Capsule& capsule);

// Replays an extract: the layer on both paths from its reference input. ReplayCapsule calls this
// for extracts. Only options.force and options.compare apply.
StatusOr<v1::ReplayReport> ReplayExtract(const v1::Capsule& extract, const ModelRegistry& registry,
                                         const ReplayOptions& options);

}  // namespace capsule

#endif  // CAPSULE_REPLAY_EXTRACT_H_
