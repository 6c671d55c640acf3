#include "capsule/replay/minimize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "capsule/proto/capsule.pb.h"
#include "capsule/proto/replay_report.pb.h"
#include "capsule/snapshot/internal/tensor_codec.h"

namespace capsule {
namespace {

// The verdict held constant: the diagnosis, with the first divergent layer for NUMERICS and the
// first failed check of an earlier stage.
std::string VerdictOf(const v1::ReplayReport& r) {
  std::string v = v1::Diagnosis_Name(r.diagnosis());
  if (r.diagnosis() == v1::NUMERICS && r.has_first_divergent_layer()) {
    v +=
        " at " + r.first_divergent_layer() + " (" + v1::Phase_Name(r.first_divergent_phase()) + ")";
  }
  for (const auto& s : r.stages()) {
    if (s.stage() == v1::STAGE_NUMERICS) continue;
    for (const auto& f : s.findings()) {
      if (f.failed()) return v + ": " + f.check();
    }
  }
  return v;
}

bool IsFailure(const v1::ReplayReport& r) {
  return r.diagnosis() != v1::NO_DIVERGENCE && r.diagnosis() != v1::TRANSIENT &&
         r.diagnosis() != v1::DIAGNOSIS_UNSPECIFIED;
}

bool NonFiniteTrigger(v1::TriggerKind k) {
  return k == v1::NON_FINITE_LOSS || k == v1::NON_FINITE_GRAD || k == v1::EXCEPTION;
}

std::string Truncated(const std::string& bytes, int64_t length) {
  return bytes.empty() ? bytes : bytes.substr(0, static_cast<size_t>(length));
}

// The capsule with only the sequences `keep` (in order), each cut to its first `length`
// positions. Sections that described the whole batch are dropped or neutralised (header).
// The optimizer step, when `keep_optimizer` is false, goes too: its gradients were the whole
// batch's.
StatusOr<v1::Capsule> Cut(const v1::Capsule& c, const std::vector<int>& keep, int64_t length,
                          bool keep_optimizer) {
  v1::Capsule out = c;
  std::vector<int64_t> rows(keep.begin(), keep.end());
  const at::Tensor index = at::tensor(rows, at::kLong);
  std::set<std::string> optimizer_tensors;
  if (!keep_optimizer) {
    for (const v1::ParamStep& p : c.optimizer().params()) {
      for (const std::string* t : {&p.grad(), &p.exp_avg(), &p.exp_avg_sq(), &p.param_after(),
                                   &p.exp_avg_after(), &p.exp_avg_sq_after()}) {
        if (!t->empty()) optimizer_tensors.insert(*t);
      }
    }
    out.clear_optimizer();
  }
  out.clear_tensors();
  for (const v1::TensorBlob& t : c.tensors()) {
    const v1::TensorRole role = t.role();
    if (role == v1::LAYER_INPUT || role == v1::REFERENCE_OUTPUT || role == v1::OPTIMIZED_OUTPUT) {
      continue;  // the original batch's activations
    }
    if (optimizer_tensors.count(t.name()) != 0) continue;
    if (role != v1::BATCH_INPUT) {
      *out.add_tensors() = t;
      continue;
    }
    CAPSULE_ASSIGN_OR_RETURN(at::Tensor x, TensorFromBlob(t));
    if (x.dim() >= 1) x = x.index_select(0, index);
    if (x.dim() == 2 && t.name() != "inputs") x = x.slice(1, 0, length);
    v1::TensorBlob& blob = *out.add_tensors();
    CAPSULE_RETURN_IF_ERROR(TensorToBlob(t.name(), x.contiguous(), &blob));
    blob.set_role(role);
    blob.set_layer(t.layer());
  }
  v1::DataBatch& data = *out.mutable_data();
  data.clear_sequences();
  data.mutable_cursor()->clear_sample_indices();
  for (int i : keep) {
    if (i < c.data().sequences_size()) {
      v1::Sequence s = c.data().sequences(i);
      if (s.token_ids_size() > length) s.mutable_token_ids()->Truncate(static_cast<int>(length));
      if (s.labels_size() > length) s.mutable_labels()->Truncate(static_cast<int>(length));
      s.set_attention_mask(Truncated(s.attention_mask(), length));
      s.set_loss_mask(Truncated(s.loss_mask(), length));
      s.set_token_count(std::min<int64_t>(s.token_count(), length));
      s.set_micro_batch(0);
      *data.add_sequences() = s;
    }
    if (i < c.data().cursor().sample_indices_size()) {
      data.mutable_cursor()->add_sample_indices(c.data().cursor().sample_indices(i));
    }
  }
  data.set_micro_batches(0);
  // Counts of the whole step no longer hold.
  out.mutable_objective()->set_normalizer(0);
  v1::Numerics& num = *out.mutable_numerics();
  num.clear_layers();
  num.clear_first_anomalous_layer();
  num.set_first_anomalous_index(-1);
  num.clear_first_anomalous_phase();
  num.clear_anomaly_reason();
  // A spike's threshold was for the whole batch, and a manual capture's loss too: the candidate is
  // judged by its layers and stages (fidelity NOT_CHECKED). A non-finite trigger is kept: the
  // smaller batch must still produce it.
  v1::Trigger& trig = *out.mutable_trigger();
  trig.clear_capture_rerun();
  trig.clear_rerun_observed();
  if (!NonFiniteTrigger(c.trigger().kind())) {
    trig.set_rule("minimized from a " + v1::TriggerKind_Name(c.trigger().kind()) + " capture");
    trig.set_kind(v1::MANUAL);
    trig.set_observed(std::nan(""));
    trig.set_threshold(0);
    auto* history = out.mutable_step()->mutable_history();
    for (int i = history->size() - 1; i >= 0; --i) {
      if (history->Get(i).step() == c.step().global_step()) history->DeleteSubrange(i, 1);
    }
  }
  return out;
}

using FailsFn = std::function<StatusOr<bool>(const std::vector<int>&, int64_t)>;
using ReplayFn = std::function<StatusOr<v1::ReplayReport>(const v1::Capsule&)>;

// The batch tensor minimize cuts: input_ids, else inputs; null when the capsule has neither.
const v1::TensorBlob* BatchIds(const v1::Capsule& c) {
  const v1::TensorBlob* ids = nullptr;
  for (const v1::TensorBlob& t : c.tensors()) {
    if (t.role() == v1::BATCH_INPUT && (t.name() == "input_ids" || t.name() == "inputs")) {
      ids = &t;
      if (t.name() == "input_ids") break;
    }
  }
  return ids;
}

// Delta debugging over the sequences `keep`: keep one chunk, else drop one, at finer granularity,
// while the budget lasts. Returns the smallest subset found that still fails alike.
StatusOr<std::vector<int>> ShrinkSequences(std::vector<int> keep, int64_t length,
                                           const FailsFn& fails, const MinimizeResult& result) {
  size_t chunks = 2;
  while (keep.size() > 1 && !result.budget_exhausted) {
    const size_t size = (keep.size() + chunks - 1) / chunks;
    bool reduced = false;
    for (size_t start = 0; start < keep.size() && !reduced; start += size) {
      std::vector<int> chunk(keep.begin() + start,
                             keep.begin() + std::min(keep.size(), start + size));
      CAPSULE_ASSIGN_OR_RETURN(bool f, fails(chunk, length));
      if (f) {
        keep = chunk;
        chunks = 2;
        reduced = true;
      }
    }
    for (size_t start = 0; start < keep.size() && !reduced && chunks > 2; start += size) {
      std::vector<int> rest(keep.begin(), keep.begin() + start);
      rest.insert(rest.end(), keep.begin() + std::min(keep.size(), start + size), keep.end());
      CAPSULE_ASSIGN_OR_RETURN(bool f, fails(rest, length));
      if (f) {
        keep = rest;
        chunks = std::max<size_t>(chunks - 1, 2);
        reduced = true;
      }
    }
    if (reduced) continue;
    if (chunks >= keep.size()) break;
    chunks = std::min(chunks * 2, keep.size());
  }
  return keep;
}

// The shortest prefix of `length` positions that still fails (assumed monotone in the length).
StatusOr<int64_t> ShrinkLength(const std::vector<int>& keep, int64_t length, const FailsFn& fails,
                               const MinimizeResult& result) {
  int64_t lo = 1, hi = length;
  while (lo < hi && !result.budget_exhausted) {
    const int64_t mid = lo + (hi - lo) / 2;
    CAPSULE_ASSIGN_OR_RETURN(bool f, fails(keep, mid));
    if (f) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return hi;
}

// What the failure needs in sequences and positions, one sentence each.
void NoteSizeNeeds(const std::vector<int>& keep, int64_t length, bool tokens, int64_t t0,
                   MinimizeResult* result) {
  if (keep.size() == 1) {
    result->needs.push_back("one sequence is enough: sequence " + std::to_string(keep[0]) +
                            " of the original batch");
  } else {
    result->needs.push_back(std::to_string(keep.size()) +
                            " sequences are needed together: no smaller subset tried fails alike");
  }
  if (tokens && t0 > 1) {
    result->needs.push_back(
        length > 1 ? "the failure needs T >= " + std::to_string(length) +
                         " (T = " + std::to_string(length - 1) + " does not fail alike)"
                   : "the failure needs no length: it fails with a single position");
  }
}

// The thread count, restored as one more dimension: reductions split by thread can change the
// result, so a failure that needs the captured count is a different bug from one that does not.
// One replay of the minimized capsule with another count.
Status NoteThreadNeeds(const ReplayFn& replay, const MinimizeOptions& options,
                       MinimizeResult* result) {
  const int threads = result->capsule->numerics().intra_op_threads() > 0
                          ? result->capsule->numerics().intra_op_threads()
                          : result->capsule->environment().intra_op_threads();
  if (threads > 0 && result->replays < options.max_replays) {
    v1::Capsule other = *result->capsule;
    const int alt = threads == 1 ? 2 : 1;
    other.mutable_numerics()->set_intra_op_threads(alt);
    CAPSULE_ASSIGN_OR_RETURN(v1::ReplayReport r, replay(other));
    const bool alike = IsFailure(r) && VerdictOf(r) == result->verdict;
    if (r.intra_op_threads() != alt) {
      // Replay runs at most as many threads as this process has CPUs.
      result->needs.push_back("the thread count was not varied: a replay with " +
                              std::to_string(alt) + " intra-op threads ran with " +
                              std::to_string(r.intra_op_threads()) + " here");
    } else {
      result->needs.push_back(
          alike ? "the thread count does not matter: it fails alike with " + std::to_string(alt) +
                      " intra-op threads as with " + std::to_string(threads)
                : "the failure needs " + std::to_string(threads) + " intra-op threads: with " +
                      std::to_string(alt) + " the replay gives " + VerdictOf(r));
    }
  }
  return Status::Ok();
}

}  // namespace

MinimizeResult::MinimizeResult() = default;
MinimizeResult::~MinimizeResult() = default;
MinimizeResult::MinimizeResult(MinimizeResult&&) noexcept = default;
MinimizeResult& MinimizeResult::operator=(MinimizeResult&&) noexcept = default;

StatusOr<MinimizeResult> MinimizeCapsule(const v1::Capsule& c, const ModelRegistry& registry,
                                         const MinimizeOptions& options) {
  const v1::TensorBlob* ids = BatchIds(c);
  if (ids == nullptr || ids->meta().shape_size() < 1) {
    return FailedPreconditionError("the capsule has no batch tensor to cut (input_ids or inputs)");
  }
  const int64_t n = ids->meta().shape(0);
  const bool tokens = ids->name() == "input_ids" && ids->meta().shape_size() == 2;
  const int64_t t0 = tokens ? ids->meta().shape(1) : 1;

  MinimizeResult result;
  result.sequences_before = n;
  result.length_before = t0;
  auto replay = [&](const v1::Capsule& candidate) -> StatusOr<v1::ReplayReport> {
    ++result.replays;
    if (options.progress) {
      options.progress("replay " + std::to_string(result.replays) + " of at most " +
                       std::to_string(options.max_replays));
    }
    return ReplayCapsule(candidate, registry, options.replay);
  };
  CAPSULE_ASSIGN_OR_RETURN(v1::ReplayReport original, replay(c));
  if (!IsFailure(original)) {
    return FailedPreconditionError("the capsule does not fail on this build (diagnosis " +
                                   v1::Diagnosis_Name(original.diagnosis()) +
                                   "): there is no failure to keep while shrinking it");
  }
  result.verdict = VerdictOf(original);
  const bool keep_optimizer = original.diagnosis() == v1::OPTIMIZER;

  std::vector<int> keep(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keep[static_cast<size_t>(i)] = static_cast<int>(i);
  int64_t length = t0;
  // Whether the candidate still gives the original verdict. `keep` and `length` change only to a
  // candidate for which this said true, so the final pair has been replayed to the verdict.
  auto fails = [&](const std::vector<int>& k, int64_t len) -> StatusOr<bool> {
    if (result.replays >= options.max_replays) {
      result.budget_exhausted = true;
      return false;
    }
    CAPSULE_ASSIGN_OR_RETURN(v1::Capsule candidate, Cut(c, k, len, keep_optimizer));
    auto r = replay(candidate);
    // A candidate the model cannot run (too short for it, say) does not fail the same way.
    return r.ok() && VerdictOf(*r) == result.verdict;
  };

  CAPSULE_ASSIGN_OR_RETURN(keep, ShrinkSequences(std::move(keep), length, fails, result));
  if (tokens && t0 > 1 && !result.budget_exhausted) {
    CAPSULE_ASSIGN_OR_RETURN(length, ShrinkLength(keep, length, fails, result));
  }
  const bool smaller = static_cast<int64_t>(keep.size()) < n || length < t0;
  v1::Capsule final_capsule = c;  // nothing smaller fails alike: the original is the answer
  if (smaller) {
    CAPSULE_ASSIGN_OR_RETURN(final_capsule, Cut(c, keep, length, keep_optimizer));
  }
  final_capsule.add_capture_notes(
      "minimized by capsule minimize: " + std::to_string(keep.size()) + " of " + std::to_string(n) +
      " sequences, the first " + std::to_string(length) + " of " + std::to_string(t0) +
      " positions; raw samples are the original ones; verdict kept: " + result.verdict);
  result.capsule = std::make_unique<v1::Capsule>(std::move(final_capsule));
  result.sequences_after = static_cast<int64_t>(keep.size());
  result.length_after = length;
  NoteSizeNeeds(keep, length, tokens, t0, &result);
  CAPSULE_RETURN_IF_ERROR(NoteThreadNeeds(replay, options, &result));
  if (result.budget_exhausted) {
    result.needs.push_back("the replay budget (" + std::to_string(options.max_replays) +
                           ") ran out: a smaller input may still exist");
  }
  return result;
}

}  // namespace capsule
