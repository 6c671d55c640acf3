// The OpenEnvelope fuzz target: every input as a capsule file, and re-sealed under a fresh digest
// so that mutated headers get past check 9 (FORMAT.md §6, checks 2–10). Each outcome is held to
// what the envelope promises: a rejection has a proper code for its check and a message; an
// accepted envelope lays out exactly inside the input, its digest is the one recomputed here, and
// its signature state is one the options allow; any cut of it is OUT_OF_RANGE, any byte after
// it DATA_LOSS. A broken invariant aborts: a crash is a finding.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
namespace {

bool IsEnvelopeCode(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:  // empty, bad magic
    case StatusCode::kOutOfRange:       // truncated
    case StatusCode::kUnimplemented:    // newer major, required flag, signature algorithm
    case StatusCode::kDataLoss:         // corrupt header, trailer, digest
    case StatusCode::kUnauthenticated:  // unsigned, untrusted, bad signature
      return true;
    default:
      return false;
  }
}

void Check(std::string_view bytes, const OpenOptions& options) {
  StatusOr<OpenedEnvelope> e = OpenEnvelope(bytes, options);
  if (!e.ok()) {
    if (!IsEnvelopeCode(e.status().code()) || e.status().message().empty()) {
      Fail("envelope rejection without an envelope code and message", e.status());
    }
    return;
  }
  const EnvelopeInfo& info = e->info;
  const EnvelopeHeader& h = info.header;
  if (h.major != kFormatMajor || (h.required_flags & ~kKnownRequiredFlags) != 0 ||
      h.header_size < kHeaderSizeV1 || h.payload_codec != kPayloadCodecZstd) {
    Fail("accepted a header the format refuses", Status());
  }
  if (info.file_size != bytes.size() || e->payload.size() != h.payload_size ||
      e->payload.data() != bytes.data() + h.header_size) {
    Fail("payload does not lie where the header says", Status());
  }
  const uint64_t sig_size = info.signature_algorithm == kSigAlgEd25519 ? kEd25519SignatureSize : 0;
  if (h.header_size + h.payload_size + kTrailerFixedSize + sig_size != bytes.size()) {
    Fail("accepted sizes that do not add up to the file", Status());
  }
  if (*Sha256(*SignedMessage(bytes.substr(0, h.header_size), e->payload)) != info.digest) {
    Fail("accepted a digest that is not SHA-256 of the signed message", Status());
  }
  switch (info.signature) {
    case SignatureState::kUnsigned:
      if (!options.allow_unsigned || info.signature_algorithm != kSigAlgNone ||
          info.key_id != std::string(kSha256Size, '\0')) {
        Fail("accepted an unsigned capsule it should not have", Status());
      }
      break;
    case SignatureState::kNotChecked:
      if (!options.allow_untrusted) Fail("accepted an untrusted signer", Status());
      if (!info.signer_key.empty()) Fail("did not check the signer key it carries", Status());
      break;
    case SignatureState::kValidUnknownSigner: {
      if (!options.allow_untrusted) Fail("accepted an untrusted signer", Status());
      // The carried key names the signer and checks the signature, as a trusted one would.
      StatusOr<PublicKey> carried = PublicKey::FromRaw(info.signer_key);
      if (!carried.ok() || carried->KeyId() != info.key_id ||
          (h.optional_flags & kOptionalFlagSignerKey) == 0 ||
          !Verify(*carried, *SignedMessage(bytes.substr(0, h.header_size), e->payload),
                  bytes.substr(bytes.size() - kTrailerTailSize - kEd25519SignatureSize,
                               kEd25519SignatureSize))
               .ok()) {
        Fail("accepted a carried signer key that does not check", Status());
      }
      break;
    }
    case SignatureState::kVerified: {
      bool trusted = false;
      for (const PublicKey& k : options.trusted_keys) trusted = trusted || k.KeyId() == info.key_id;
      if (!trusted) Fail("verified with a key that is not trusted", Status());
      break;
    }
  }
  // Cuts and extensions of an accepted file.
  for (size_t n : {size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    const Status cut = OpenEnvelope(bytes.substr(0, n), options).status();
    if (cut.code() != StatusCode::kOutOfRange) Fail("a cut was not OUT_OF_RANGE", cut);
  }
  const Status longer = OpenEnvelope(std::string(bytes) + '\0', options).status();
  if (longer.code() != StatusCode::kDataLoss) Fail("an extension was not DATA_LOSS", longer);
}

void TestOneInput(std::string_view bytes) {
  static const OpenOptions* const kStrict = [] {
    auto* o = new OpenOptions();
    o->trusted_keys = FuzzReadOptions().trusted_keys;
    return o;
  }();
  static const OpenOptions* const kLoose = [] {
    auto* o = new OpenOptions(*kStrict);
    o->allow_unsigned = true;
    o->allow_untrusted = true;
    return o;
  }();
  Check(bytes, *kStrict);
  Check(bytes, *kLoose);
  if (std::optional<std::string> resealed = ResealUnsigned(bytes)) {
    Check(*resealed, *kStrict);
    Check(*resealed, *kLoose);
  }
}

}  // namespace
}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  capsule::fuzz::TestOneInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
