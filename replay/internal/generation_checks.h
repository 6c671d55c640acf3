// The generation section's recorded settings, checked against what the training run recorded and
// against the tokens themselves: the parity checks a decode's numbers cannot show (the tokens
// replay as recorded, whatever tokenizer made them). Each check that fails adds a failed
// ParityFinding after the numeric ones; one that holds, or lacks a side to compare, adds none.
//
//   AddGenerationSettingChecks(capsule, batch.input_ids, report.mutable_parity());
//
// Thread safety: pure function of its arguments.
#ifndef CAPSULE_REPLAY_INTERNAL_GENERATION_CHECKS_H_
#define CAPSULE_REPLAY_INTERNAL_GENERATION_CHECKS_H_

namespace at {
class Tensor;
}  // namespace at

namespace capsule::v1 {
class Capsule;
class ParityReport;
}  // namespace capsule::v1

namespace capsule::internal {

// `input_ids`: int64 [batch, seq], the sequence the parity replay ran (undefined: no token check).
void AddGenerationSettingChecks(const v1::Capsule& capsule, const at::Tensor& input_ids,
                                v1::ParityReport* report);

}  // namespace capsule::internal

#endif  // CAPSULE_REPLAY_INTERNAL_GENERATION_CHECKS_H_
