// Derivations: what a capsule made from another one keeps of its source (proto/FORMAT.md §3.1).
//
// `capsule redact`, `extract` and `minimize` write a capsule from another capsule's content and
// sign it with their user's key. That signature vouches for the command's run, not for where the
// content came from. So the new capsule records, in Capsule.derivations, the source file, who
// signed it and how far the command trusted that signer, after the source's own records: the
// chain runs back to the capsule a trainer wrote. Every reader holds a capsule to the least
// trusted of its own signer and those sources (DecodeCapsule, FORMAT.md §6 check 21), so
// re-signing never launders trust: an extract of a stranger's capsule signed with the team's key
// is still a stranger's capsule.
//
//   CAPSULE_RETURN_IF_ERROR(capsule::RecordDerivation(*source.capsule, source.envelope,
//                                                     source_sha256, "extract", 0, &extract));
//   if (const capsule::v1::Derivation* d = capsule::UntrustedSource(capsule)) {
//     std::cout << capsule::DescribeDerivation(*d) << "\n";
//   }
//
// Thread safety: pure functions; thread-safe.
#ifndef CAPSULE_FORMAT_DERIVATION_H_
#define CAPSULE_FORMAT_DERIVATION_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"
#include "capsule/format/envelope.h"

namespace capsule {

// The most entries Capsule.derivations may hold (ValidateCapsule).
inline constexpr int kMaxDerivations = 64;

// 1 to 32 characters of a-z, 0-9, '-' and '_': what Derivation.tool may be ("redact").
bool IsDerivationToolName(std::string_view tool);

// Sets out->derivations to source's followed by one entry for this step: `tool` wrote `out` from
// `source`, a file whose SHA-256 is `source_sha256` (lowercase hex) and whose envelope read as
// `source_envelope`; at `now_unix_micros` (0: the current time). `out` may be `&source` (redact
// edits the message it read). kInvalidArgument for a tool name or digest the schema refuses,
// kResourceExhausted when the chain is full (kMaxDerivations).
Status RecordDerivation(const v1::Capsule& source, const EnvelopeInfo& source_envelope,
                        std::string_view source_sha256, std::string_view tool,
                        int64_t now_unix_micros, v1::Capsule* out);

// The Trust that records a signature state (Derivation.source_trust, InputTrust.signature).
v1::Trust TrustOf(SignatureState s);

// The signature state a derivation records for its source (kVerified: its maker trusted it).
SignatureState SourceState(const v1::Derivation& d);

// The least trusted source `c` records that its maker did not verify (the first of the weakest),
// or null when there is none.
const v1::Derivation* UntrustedSource(const v1::Capsule& c);

// Check 21 of FORMAT.md §6: OK when every source `c` records is acceptable as a signature state
// would be (unverified sources with `allow_untrusted`, unsigned ones with `allow_unsigned` too);
// kUnauthenticated "capsule was made by ..." naming the least trusted otherwise.
Status CheckDerivations(const v1::Capsule& c, bool allow_untrusted, bool allow_unsigned);

// One line, for people: "made by extract from capsule 1a2b3c4d5e6f7a8b, valid signature by key
// e448b71cbacdb21e, NOT trusted by its maker". Names a key and a file by their first 16 hex
// digits. For a derivation ValidateCapsule accepted (its strings are then plain ASCII).
std::string DescribeDerivation(const v1::Derivation& d);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_DERIVATION_H_
