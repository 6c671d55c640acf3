#include "capsule/format/derivation.h"

#include <chrono>

#include "capsule/base/internal/sha256.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

// From the most trusted (0) to the least; what "least trusted" compares.
int Rank(SignatureState s) {
  switch (s) {
    case SignatureState::kVerified:
      return 0;
    case SignatureState::kValidUnknownSigner:
      return 1;
    case SignatureState::kNotChecked:
      return 2;
    case SignatureState::kUnsigned:
      return 3;
  }
  return 3;
}

}  // namespace

v1::Trust TrustOf(SignatureState s) {
  switch (s) {
    case SignatureState::kVerified:
      return v1::TRUST_VERIFIED;
    case SignatureState::kValidUnknownSigner:
      return v1::TRUST_VALID_UNKNOWN_SIGNER;
    case SignatureState::kNotChecked:
      return v1::TRUST_NOT_CHECKED;
    case SignatureState::kUnsigned:
      return v1::TRUST_UNSIGNED;
  }
  return v1::TRUST_UNSPECIFIED;
}

bool IsDerivationToolName(std::string_view tool) {
  if (tool.empty() || tool.size() > 32) return false;
  for (char ch : tool) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_')) {
      return false;
    }
  }
  return true;
}

Status RecordDerivation(const v1::Capsule& source, const EnvelopeInfo& source_envelope,
                        std::string_view source_sha256, std::string_view tool,
                        int64_t now_unix_micros, v1::Capsule* out) {
  if (!IsDerivationToolName(tool)) {
    return InvalidArgumentError(
        "derivation tool name must be 1 to 32 characters of a-z, 0-9, "
        "'-' and '_'");
  }
  if (!IsSha256Hex(source_sha256)) {
    return InvalidArgumentError("derivation source must be named by its lowercase hex SHA-256");
  }
  if (source.derivations_size() >= kMaxDerivations) {
    return ResourceExhaustedError("the capsule was already made in " +
                                  std::to_string(source.derivations_size()) +
                                  " steps, the most a capsule records; start from an earlier one");
  }
  if (out != &source) *out->mutable_derivations() = source.derivations();
  v1::Derivation* d = out->add_derivations();
  d->set_tool(std::string(tool));
  d->set_source_sha256(std::string(source_sha256));
  d->set_source_trust(TrustOf(source_envelope.signature));
  if (source_envelope.signature != SignatureState::kUnsigned) {
    d->set_source_signer_key_id(HexEncode(source_envelope.key_id));
  }
  d->set_derived_unix_micros(now_unix_micros != 0
                                 ? now_unix_micros
                                 : std::chrono::duration_cast<std::chrono::microseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count());
  return Status::Ok();
}

SignatureState SourceState(const v1::Derivation& d) {
  switch (d.source_trust()) {
    case v1::TRUST_VERIFIED:
      return SignatureState::kVerified;
    case v1::TRUST_VALID_UNKNOWN_SIGNER:
      return SignatureState::kValidUnknownSigner;
    case v1::TRUST_NOT_CHECKED:
      return SignatureState::kNotChecked;
    default:  // unsigned, and what validation refuses: the least trusted
      return SignatureState::kUnsigned;
  }
}

const v1::Derivation* UntrustedSource(const v1::Capsule& c) {
  const v1::Derivation* weakest = nullptr;
  for (const v1::Derivation& d : c.derivations()) {
    if (SourceState(d) == SignatureState::kVerified) continue;
    if (weakest == nullptr || Rank(SourceState(d)) > Rank(SourceState(*weakest))) weakest = &d;
  }
  return weakest;
}

Status CheckDerivations(const v1::Capsule& c, bool allow_untrusted, bool allow_unsigned) {
  const v1::Derivation* d = UntrustedSource(c);
  if (d == nullptr) return Status::Ok();
  const bool accepted =
      SourceState(*d) == SignatureState::kUnsigned ? allow_unsigned : allow_untrusted;
  if (accepted) return Status::Ok();
  return UnauthenticatedError("capsule was " + DescribeDerivation(*d));
}

std::string DescribeDerivation(const v1::Derivation& d) {
  const std::string key = d.source_signer_key_id().substr(0, 16);
  std::string out = "made by " + d.tool() + " from capsule " + d.source_sha256().substr(0, 16);
  switch (SourceState(d)) {
    case SignatureState::kVerified:
      return out + ", signed by key " + key + ", trusted by its maker";
    case SignatureState::kValidUnknownSigner:
      return out + ", valid signature by key " + key + ", NOT trusted by its maker";
    case SignatureState::kNotChecked:
      return out + ", signed by key " + key + " (format 1.0), signature NOT checked by its maker";
    case SignatureState::kUnsigned:
      break;
  }
  return out + ", which was UNSIGNED";
}

}  // namespace capsule
