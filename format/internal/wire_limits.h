// A pass over a serialized capsule.v1.Capsule, driven by the schema, that counts what parsing it
// would build before anything is built (proto/FORMAT.md §6, checks 15–18). Protobuf's parser
// happily turns two bytes into a message object of a hundred, and keeps every field it does not
// know; this pass refuses a payload whose parse would cost far more than its size, in time linear
// in the bytes and with no allocation.
//
// It runs while the payload is decompressed: WireScanner takes the bytes as they arrive and
// judges each field from its tag and length, so a payload that declares a 900 MiB unknown field
// is refused after its first chunk, not after 900 MiB. Internal to capsule::format.
//
//   CAPSULE_RETURN_IF_ERROR(internal::CheckWireLimits(serialized, options.limits));
//
// Thread safety: CheckWireLimits is thread-safe; a WireScanner is used by one thread.
#ifndef CAPSULE_FORMAT_INTERNAL_WIRE_LIMITS_H_
#define CAPSULE_FORMAT_INTERNAL_WIRE_LIMITS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_reader.h"

namespace google::protobuf {
class Descriptor;
}  // namespace google::protobuf

namespace capsule::internal {

// What the scan counted (for tests and measurements).
struct WireCounts {
  uint64_t unknown_field_bytes = 0;  // tag and value of every field the schema does not define
  uint64_t messages = 0;             // embedded messages, map entries included
  uint64_t repeated_strings = 0;     // elements of repeated string and bytes fields
  uint64_t repeated_numbers = 0;     // elements of repeated numeric fields, packed or not
  uint64_t longest_string = 0;       // bytes of the longest string (UTF-8 text) field
};

// Scans a payload of `total` bytes that arrives in order. Errors: kResourceExhausted naming the
// limit exceeded; kDataLoss "corrupt payload (not a capsule.v1.Capsule message)" for bytes
// protobuf would not parse either (truncated values, wire types 6 and 7, field number 0,
// unbalanced groups, a length past its message).
class WireScanner {
 public:
  WireScanner(const ContentLimits& limits, uint64_t total);

  // `data` holds the first `available` bytes of the payload (the same buffer, growing, on every
  // call). Scans as far as they allow; OK means "no limit broken so far".
  Status Advance(const char* data, uint64_t available);
  // The same for a payload that passes through a window: `window` holds bytes [begin, end) of
  // the payload, and each call's `begin` is the previous call's `end`. The few bytes of a field
  // header cut by a window's end are kept here until the next window completes it, so the caller
  // may reuse its buffer.
  Status Advance(const char* window, uint64_t begin, uint64_t end);
  // After Advance saw all `total` bytes: OK when the message ended where it should.
  Status Finish() const;

  const WireCounts& counts() const { return counts_; }

 private:
  struct Frame {
    const google::protobuf::Descriptor* message;  // null: inside an unknown group
    uint64_t end;    // of the message (of the enclosing one, for a group)
    uint32_t group;  // field number of the group
  };
  // Judges the field whose header starts at pos_; `bytes` holds the `have` bytes from there.
  Status Field(const uint8_t* bytes, uint64_t have);
  // Keeps bytes [pos_, end) (part of a field header) for the next window.
  void Carry(const uint8_t* window, uint64_t begin, uint64_t end);
  Status AddUnknown(uint64_t n);
  Status AddNumbers(uint64_t n);

  const ContentLimits& limits_;
  const uint64_t total_;
  WireCounts counts_;
  std::vector<Frame> stack_;
  uint64_t pos_ = 0;
  // Inside a packed varint field, until packed_end_: varints are counted byte by byte.
  bool in_packed_ = false;
  uint64_t packed_end_ = 0;
  int packed_run_ = 0;  // continuation bytes of the varint being counted
  bool done_ = false;
  Status error_;
  // Bytes [carry_at_, carry_at_ + carry_size_) of the payload, from before the current window.
  uint8_t carry_[16] = {};
  uint64_t carry_at_ = 0;
  uint64_t carry_size_ = 0;
};

// The whole payload at once. `counts`, when given, receives the totals scanned.
Status CheckWireLimits(std::string_view serialized, const ContentLimits& limits,
                       WireCounts* counts = nullptr);

}  // namespace capsule::internal

#endif  // CAPSULE_FORMAT_INTERNAL_WIRE_LIMITS_H_
