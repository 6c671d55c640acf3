#include "capsule/report/inspect_text.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/base/internal/strings.h"
#include "capsule/format/derivation.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/report/replay_tool.h"

namespace capsule {
namespace {

// At most this many entries of a list are shown; the rest are counted.
constexpr int kMaxListed = 32;

// Calls show(entry) for the first `max` entries of `list`, then says how many were left out,
// ending that line with `end`.
template <typename List, typename Show>
void ShowList(const List& list, int max, std::ostream& out, Show show, const char* end) {
  int shown = 0;
  for (const auto& entry : list) {
    if (shown++ == max) break;
    show(entry);
  }
  if (list.size() > max) out << "  \u2026 " << (list.size() - max) << " more" << end;
}

// The last few collectives are what a hang is read from; `capsule triage` aligns the whole ring
// across ranks.
constexpr int kCollectivesShown = 4;

void Distributed(const v1::Capsule& c, std::ostream& out) {
  const v1::Distributed& d = c.distributed();
  out << "distributed: run " << PrintableShort(d.run_id()) << ", rank " << c.placement().rank()
      << " of " << c.placement().world_size() << ", " << PrintableShort(d.backend())
      << ", last step " << d.last_step() << "; " << d.collectives_size() << " collectives, "
      << d.reductions_size() << " reductions, " << d.fingerprints_size() << " fingerprints\n";
  for (int i = std::max(0, d.collectives_size() - kCollectivesShown); i < d.collectives_size();
       ++i) {
    const v1::Collective& k = d.collectives(i);
    out << "  collective " << k.sequence() << " (step " << k.step()
        << "): " << PrintableShort(k.op()) << " " << PrintableShort(k.tag()) << ", " << k.numel()
        << " " << PrintableShort(k.dtype()) << ", " << v1::CollectiveState_Name(k.state());
    if (!k.error().empty()) out << ": " << PrintableShort(k.error());
    out << "\n";
  }
  if (d.reductions_size() > 0) {
    const v1::GradReduction& r = d.reductions(d.reductions_size() - 1);
    out << "  reduction at step " << r.step() << " (sequence " << r.sequence() << "): local norm "
        << FormatSignificant(r.local_norm(), 6) << " (" << r.local_non_finite()
        << " non-finite), reduced " << FormatSignificant(r.global_norm(), 6) << " ("
        << r.global_non_finite() << " non-finite), divisor " << FormatSignificant(r.divisor(), 6)
        << "\n";
  }
  if (d.has_agreement()) {
    const v1::TriggerAgreement& a = d.agreement();
    out << "  agreement at step " << a.step() << ": fired";
    if (a.fired().empty()) out << " none";
    ShowList(
        a.fired(), kMaxListed, out,
        [&out](const v1::RankTrigger& f) {
          out << " " << f.rank() << ":" << v1::TriggerKind_Name(f.kind());
        },
        "");
    if (!a.missing_ranks().empty()) {
      out << "; missing";
      for (int m : a.missing_ranks()) out << " " << m;
    }
    if (!a.error().empty()) out << "; " << PrintableShort(a.error());
    out << "\n";
  }
  if (!d.dump_reason().empty()) out << "  dump: " << PrintableShort(d.dump_reason()) << "\n";
}

// The file, its envelope and signature, the writer and the derivations.
void SummaryEnvelope(const std::string& file, const DecodedCapsule& d, std::ostream& out) {
  const v1::Capsule& c = *d.capsule;
  const EnvelopeInfo& e = d.envelope;
  out << "capsule " << PrintableShort(file) << "\n";
  out << "  format " << e.header.major << "." << e.header.minor << ", " << e.file_size
      << " bytes (payload " << e.header.payload_size << " bytes zstd, "
      << e.header.uncompressed_size << " uncompressed)\n";
  out << "  signature: " << SignatureStateName(e.signature);
  if (e.signature_algorithm != kSigAlgNone) out << ", ed25519 key " << HexEncode(e.key_id);
  if (e.signature == SignatureState::kValidUnknownSigner) {
    out << " (not a trusted key: " << PubkeyArgument() << " trusts it)";
  } else if (e.signature == SignatureState::kNotChecked) {
    out << " (format 1.0 carries no signer key: " << PubkeyArgument() << " checks it)";
  }
  out << "\n";
  out << "  written by capsule " << PrintableShort(c.writer_version()) << " at "
      << FormatUnixMicrosUtc(c.created_unix_micros()) << ", run \"" << PrintableShort(c.run_name())
      << "\"\n";
  // Oldest first; the capsule is trusted no further than the least trusted of these.
  for (const v1::Derivation& d : c.derivations()) {
    out << "  derived " << FormatUnixMicrosUtc(d.derived_unix_micros()) << ": "
        << DescribeDerivation(d) << "\n";
  }
}

// The trigger, its rule and re-run, and the step history.
void SummaryTrigger(const v1::Capsule& c, std::ostream& out) {
  const v1::Trigger& t = c.trigger();
  out << "trigger: " << v1::TriggerKind_Name(t.kind()) << " at step " << c.step().global_step()
      << " (observed " << FormatSignificant(t.observed(), 6);
  if (t.threshold() != 0) out << ", threshold " << FormatSignificant(t.threshold(), 6);
  out << ")\n";
  if (!t.rule().empty()) out << "  rule: " << PrintableShort(t.rule()) << "\n";
  if (!t.message().empty()) out << "  message: " << PrintableShort(t.message()) << "\n";
  if (t.capture_rerun() != v1::REPRODUCTION_UNSPECIFIED) {
    out << "  capture re-run: " << v1::Reproduction_Name(t.capture_rerun()) << " (observed "
        << FormatSignificant(t.rerun_observed(), 6) << ")\n";
  }
  if (c.step().history_size() > 0) {
    out << "  history: " << c.step().history_size() << " steps, " << c.step().history(0).step()
        << ".." << c.step().history(c.step().history_size() - 1).step() << "\n";
  }
}

// The model, its weights (embedded or a named checkpoint) and the first anomalous layer.
void SummaryModel(const v1::Capsule& c, std::ostream& out) {
  if (!c.model().registry_name().empty()) {
    out << "model: " << PrintableShort(c.model().registry_name()) << " ("
        << (c.model().trainer_path() == v1::REFERENCE ? "reference" : "optimized") << " path), "
        << c.model().layers_size() << " layers\n";
    // What the capture embedded of the weights, and the checkpoint it named instead.
    out << "weights: "
        << (c.model().weight_policy() == v1::WEIGHTS_ALL ? "all embedded"
            : c.model().weight_policy() == v1::WEIGHTS_ANOMALOUS_LAYER
                ? "the anomalous layer's embedded"
                : "none embedded")
        << "\n";
    if (c.model().has_weights_reference()) {
      const v1::WeightsReference& ref = c.model().weights_reference();
      const auto buffers = std::count_if(ref.tensors().begin(), ref.tensors().end(),
                                         [](const v1::TensorDigest& t) { return t.buffer(); });
      out << "  checkpoint: " << PrintableShort(ref.path()) << " (" << PrintableShort(ref.format())
          << ", " << HumanBytes(static_cast<uint64_t>(ref.size_bytes())) << ", "
          << ref.tensors_size() << " tensors"
          << (buffers > 0 ? " of which " + std::to_string(buffers) + " buffers" : std::string())
          << ", sha256 " << ref.tensors_sha256().substr(0, 16) << "…): "
          << (ref.matches_step() ? "holds this step's weights"
                                 : "does NOT hold this step's weights")
          << "\n";
    }
  }
  const v1::Numerics& n = c.numerics();
  if (!n.first_anomalous_layer().empty()) {
    out << "first anomalous layer: " << PrintableShort(n.first_anomalous_layer()) << " ("
        << PrintableShort(n.anomaly_reason()) << ")\n";
  } else if (n.layers_size() > 0) {
    out << "first anomalous layer: none\n";
  }
  if (n.layers_size() > 0) out << "layer stats: " << n.layers_size() << " entries\n";
}

// The recorded batch and the loss's reduction.
void SummaryObjective(const v1::Capsule& c, std::ostream& out) {
  const v1::DataBatch& data = c.data();
  if (data.sequences_size() > 0) {
    int64_t tokens = 0;
    for (const auto& s : data.sequences()) {
      tokens += s.token_ids_size() > 0 ? s.token_ids_size() : s.token_count();
    }
    out << "data: " << data.sequences_size() << " sequences, " << tokens << " tokens; cursor epoch "
        << data.cursor().epoch() << " shard " << data.cursor().shard() << " offset "
        << data.cursor().offset() << "\n";
  }
  if (data.micro_batches() > 1) out << "  " << data.micro_batches() << " micro-batches\n";
  const v1::Objective& obj = c.objective();
  if (obj.reduction() != v1::LOSS_REDUCTION_UNSPECIFIED || obj.normalizer() > 0) {
    out << "objective: " << v1::LossReduction_Name(obj.reduction());
    if (obj.normalizer() > 0) out << " over " << FormatSignificant(obj.normalizer(), 9);
    if (obj.ranks() > 1) out << " on " << obj.ranks() << " ranks";
    out << "\n";
  }
}

// The optimizer's groups, its parameters and the step's clipping and loss scale.
void SummaryOptimizer(const v1::Capsule& c, std::ostream& out) {
  const v1::OptimizerStep& opt = c.optimizer();
  if (opt.params_size() > 0 || opt.groups_size() > 0) {
    int frozen = 0, exempt = 0;
    for (const auto& p : opt.params()) {
      frozen += !p.requires_grad() || p.group() < 0;
      exempt += p.decay_exempt();
    }
    out << "optimizer: " << v1::OptimizerKind_Name(opt.kind()) << ", " << opt.groups_size()
        << " groups, " << opt.params_size() << " parameters (" << frozen << " frozen, " << exempt
        << " exempt from decay); step " << (opt.observed_after() ? "observed" : "not observed");
    if (opt.found_inf()) out << "; the trainer's finite check fired";
    out << "\n";
    ShowList(
        opt.groups(), kMaxListed, out,
        [&out](const v1::ParamGroup& g) {
          out << "  group: lr " << FormatSignificant(g.lr(), 6) << ", betas "
              << FormatSignificant(g.beta1(), 6) << "/" << FormatSignificant(g.beta2(), 6)
              << ", eps " << FormatSignificant(g.eps(), 3) << ", weight decay "
              << FormatSignificant(g.weight_decay(), 6) << "\n";
        },
        "\n");
    if (opt.clip_max_norm() > 0 || opt.loss_scale() > 1) {
      out << "  clip " << FormatSignificant(opt.clip_max_norm(), 6) << " (saw "
          << FormatSignificant(opt.grad_norm_before_clip(), 6) << "), loss scale "
          << FormatSignificant(opt.loss_scale(), 6) << "\n";
    }
  }
}

// Run events, generators, embedded tensors, identity and environment.
void SummaryContents(const v1::Capsule& c, std::ostream& out) {
  if (c.events_size() > 0) {
    ShowList(
        c.events(), kMaxListed, out,
        [&out](const v1::RunEvent& e) {
          out << "event at step " << e.step() << ": " << PrintableShort(e.kind());
          if (!e.detail().empty()) out << " (" << PrintableShort(e.detail()) << ")";
          out << "\n";
        },
        "\n");
  }
  if (c.rng().generators_size() > 0) {
    out << "rng:";
    ShowList(
        c.rng().generators(), kMaxListed, out,
        [&out](const v1::RngBlob& g) { out << " " << PrintableShort(g.name()); }, "");
    out << "\n";
  }
  if (c.tensors_size() > 0) {
    uint64_t bytes = 0;
    for (const auto& tb : c.tensors()) bytes += tb.data().size();
    out << "tensors: " << c.tensors_size() << " embedded, " << HumanBytes(bytes) << "\n";
  }
  const v1::Identity& id = c.identity();
  if (!id.model_sha256().empty())
    out << "model sha256: " << PrintableShort(id.model_sha256()) << "\n";
  ShowList(
      id.files(), kMaxListed, out,
      [&out](const v1::FileIdentity& f) {
        out << "  " << PrintableShort(f.role()) << " " << PrintableShort(f.name()) << " sha256 "
            << PrintableShort(f.sha256()) << "\n";
      },
      "\n");
  const v1::Environment& env = c.environment();
  if (!env.torch_version().empty() || !env.compiler().empty()) {
    out << "environment: torch "
        << (env.torch_version().empty() ? "-" : PrintableShort(env.torch_version())) << ", "
        << env.intra_op_threads() << " intra-op threads, " << PrintableShort(env.compiler()) << ", "
        << PrintableShort(env.os()) << "\n";
  }
}

// The distributed section, capture notes and what redaction dropped.
void SummaryProvenance(const v1::Capsule& c, std::ostream& out) {
  if (c.has_distributed()) Distributed(c, out);
  ShowList(
      c.capture_notes(), kMaxListed, out,
      [&out](const std::string& note) { out << "capture note: " << PrintableShort(note) << "\n"; },
      "\n");
  if (c.redaction().dropped_size() > 0) {
    out << "redacted:";
    for (const auto& r : c.redaction().dropped()) out << " " << PrintableShort(r);
    out << "\n";
  }
  if (c.redaction().unknown_field_bytes_dropped() > 0) {
    // Redaction fails closed: fields it could not read (a newer writer's, or anyone's private
    // ones) were dropped rather than kept unseen.
    out << "  unknown fields dropped by redaction: "
        << HumanBytes(c.redaction().unknown_field_bytes_dropped()) << "\n";
  }
}

void Summary(const std::string& file, const DecodedCapsule& d, std::ostream& out) {
  SummaryEnvelope(file, d, out);
  const v1::Capsule& c = *d.capsule;
  SummaryTrigger(c, out);
  SummaryModel(c, out);
  SummaryObjective(c, out);
  SummaryOptimizer(c, out);
  SummaryContents(c, out);
  SummaryProvenance(c, out);
}

}  // namespace

std::string RenderInspectSummary(const std::string& file, const DecodedCapsule& decoded) {
  std::ostringstream out;
  Summary(file, decoded, out);
  return out.str();
}

}  // namespace capsule
