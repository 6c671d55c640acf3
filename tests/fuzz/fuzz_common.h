// What the fuzz targets of the capsule format share (tests/fuzz/*_fuzzer.cc): the fixed TEST-ONLY
// key the seed corpus is signed with, the read options every target decodes with, and the way an
// invariant that does not hold becomes a finding (abort, so libFuzzer keeps the input).
//
//   const capsule::ReadOptions& options = capsule::fuzz::FuzzReadOptions();
//   if (!ok) capsule::fuzz::Fail("what broke", status);
//
// Thread safety: thread-safe.
#ifndef CAPSULE_TESTS_FUZZ_FUZZ_COMMON_H_
#define CAPSULE_TESTS_FUZZ_FUZZ_COMMON_H_

#include <google/protobuf/message.h>

#include <optional>
#include <string>
#include <string_view>

#include "capsule/base/status.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/signing.h"

namespace capsule::fuzz {

// A fixed, public, TEST-ONLY key: the seed corpus is signed with it so the fuzzer reaches the
// verified path. Anyone can sign with it; never trust it outside tests.
PrivateKey FuzzSigningKey();
// Trusts FuzzSigningKey(), allows unsigned capsules, caps decompression at 1 MiB, checks tensor
// digests, and lowers the content limits (64 KiB of unknown fields, 4096 messages and repeated
// elements, 64 KiB strings) so that inputs of a few kilobytes reach every limit. Built once.
const ReadOptions& FuzzReadOptions();

// Prints the invariant and the status, then aborts: a crash is a finding.
[[noreturn]] void Fail(const char* what, const Status& status);

// `serialized` compressed into one frame and sealed unsigned, as a writer with validation off
// would make it.
std::string SealMessage(std::string_view serialized);

// Header ‖ payload of a capsule-shaped input under an unsigned trailer with a matching digest, so
// that mutated headers and payloads get past the digest; nullopt when the header's sizes do not
// lay out inside the input.
std::optional<std::string> ResealUnsigned(std::string_view bytes);

// What a target that works on decoded capsules reads an input as: a capsule file (magic first),
// re-sealed so that mutations get past the digest, or else a serialized message, sealed; then
// decoded with FuzzReadOptions. nullopt when it does not decode (the read target holds the
// reader to its rules).
std::optional<DecodedCapsule> DecodeFuzzInput(std::string_view bytes);

// Deterministic serialization (map entries sorted), to compare messages byte for byte.
std::string SerializeDeterministic(const google::protobuf::Message& message);

// Turns protobuf's logging of parse errors off: at a thousand inputs a second it is most of a
// fuzzer's time. Idempotent.
void QuietProtobuf();

}  // namespace capsule::fuzz

#endif  // CAPSULE_TESTS_FUZZ_FUZZ_COMMON_H_
