#include "capsule/format/internal/wire_limits.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>

#include "capsule/proto/capsule.pb.h"

namespace capsule::internal {
namespace {

using google::protobuf::FieldDescriptor;

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// Unknown groups nested deeper than this are refused; protobuf's own recursion limit is 100.
constexpr size_t kMaxGroupDepth = 64;
// The longest field header: a 5-byte tag and a 10-byte varint (or an 8-byte fixed64).
constexpr uint64_t kMaxHeader = 15;

Status Malformed() { return DataLossError("corrupt payload (not a capsule.v1.Capsule message)"); }

Status OverLimit(const char* what, uint64_t count, uint64_t limit) {
  return ResourceExhaustedError("payload holds " + std::to_string(count) + " " + what +
                                ", over the limit of " + std::to_string(limit));
}

// The wire type a field of this type is written with; packed repeated numbers also come as
// kLengthDelimited.
uint32_t NaturalWireType(const FieldDescriptor* f) {
  switch (f->type()) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return kFixed64;
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return kFixed32;
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return kLengthDelimited;
    case FieldDescriptor::TYPE_GROUP:
      return kStartGroup;
    default:
      return kVarint;
  }
}

bool ReadVarint(const uint8_t** p, const uint8_t* end, int max_bytes, uint64_t* v) {
  uint64_t result = 0;
  for (int i = 0; i < max_bytes && *p < end; ++i) {
    const uint8_t b = *(*p)++;
    result |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      *v = result;
      return true;
    }
  }
  return false;
}

// A tag: at most 5 bytes, kept modulo 2^32 as protobuf's parser keeps it.
bool ReadTag(const uint8_t** p, const uint8_t* end, uint32_t* number, uint32_t* wire) {
  uint64_t tag = 0;
  if (!ReadVarint(p, end, 5, &tag)) return false;
  *number = static_cast<uint32_t>((tag & 0xffffffffu) >> 3);
  *wire = static_cast<uint32_t>(tag & 7);
  return true;
}

// A length prefix: protobuf reads it as a 32-bit size below 2^31.
bool ReadLength(const uint8_t** p, const uint8_t* end, uint64_t* size) {
  return ReadVarint(p, end, 5, size) && *size < (uint64_t{1} << 31);
}

// Reads past a varint, fixed64 or fixed32 value; false when it does not fit before `end`.
bool SkipScalar(const uint8_t** p, const uint8_t* end, uint32_t wire) {
  uint64_t scratch = 0;
  switch (wire) {
    case kVarint:
      return ReadVarint(p, end, 10, &scratch);
    case kFixed64:
    case kFixed32: {
      const ptrdiff_t n = wire == kFixed64 ? 8 : 4;
      if (end - *p < n) return false;
      *p += n;
      return true;
    }
    default:
      return false;
  }
}

}  // namespace

WireScanner::WireScanner(const ContentLimits& limits, uint64_t total)
    : limits_(limits), total_(total) {
  stack_.push_back({v1::Capsule::descriptor(), total, 0});
}

Status WireScanner::AddUnknown(uint64_t n) {
  counts_.unknown_field_bytes += n;
  if (counts_.unknown_field_bytes > limits_.max_unknown_field_bytes) {
    return OverLimit("bytes of fields this reader does not know", counts_.unknown_field_bytes,
                     limits_.max_unknown_field_bytes);
  }
  return Status::Ok();
}

Status WireScanner::AddNumbers(uint64_t n) {
  counts_.repeated_numbers += n;
  if (counts_.repeated_numbers > limits_.max_repeated_numbers) {
    return OverLimit("repeated numbers", counts_.repeated_numbers, limits_.max_repeated_numbers);
  }
  return Status::Ok();
}

Status WireScanner::Advance(const char* data, uint64_t available) {
  return Advance(data, 0, available);
}

Status WireScanner::Advance(const char* chars, uint64_t begin, uint64_t end) {
  if (!error_.ok() || done_) return error_;
  const auto* window = reinterpret_cast<const uint8_t*>(chars);
  end = std::min(end, total_);
  if (pos_ < begin && (carry_at_ > pos_ || carry_at_ + carry_size_ < begin)) {
    return error_ = InternalError("wire scan: a window skipped bytes it had not seen");
  }
  for (;;) {
    if (in_packed_) {
      // One varint ends at each byte below 0x80.
      const uint64_t stop = std::min(packed_end_, end);
      uint64_t n = 0;
      auto count = [&](uint8_t b) {
        if ((b & 0x80) == 0) {
          ++n;
          packed_run_ = 0;
          return true;
        }
        return ++packed_run_ < 10;  // a varint is at most 10 bytes
      };
      for (; pos_ < std::min(stop, begin); ++pos_) {
        if (!count(carry_[pos_ - carry_at_])) return error_ = Malformed();
      }
      for (; pos_ < stop; ++pos_) {
        if (!count(window[pos_ - begin])) return error_ = Malformed();
      }
      if (Status s = AddNumbers(n); !s.ok()) return error_ = s;
      if (pos_ < packed_end_) return Status::Ok();        // the rest has not arrived yet
      if (packed_run_ != 0) return error_ = Malformed();  // the last varint is cut short
      in_packed_ = false;
      continue;
    }
    const Frame& top = stack_.back();
    if (top.message != nullptr && pos_ == top.end) {
      if (stack_.size() == 1) {
        done_ = true;
        return Status::Ok();
      }
      stack_.pop_back();
      continue;
    }
    // A field header lies within its message; wait until all of it (or the message's end) is in.
    if (pos_ >= end) return Status::Ok();
    if (end < std::min(top.end, pos_ + kMaxHeader)) {
      Carry(window, begin, end);
      return Status::Ok();
    }
    const uint64_t have = std::min(end - pos_, kMaxHeader);
    if (pos_ >= begin) {
      if (Status s = Field(window + (pos_ - begin), have); !s.ok()) return error_ = s;
      continue;
    }
    // The header started in the last window.
    uint8_t joined[kMaxHeader];
    for (uint64_t i = 0; i < have; ++i) {
      const uint64_t at = pos_ + i;
      joined[i] = at >= begin ? window[at - begin] : carry_[at - carry_at_];
    }
    if (Status s = Field(joined, have); !s.ok()) return error_ = s;
  }
}

void WireScanner::Carry(const uint8_t* window, uint64_t begin, uint64_t end) {
  uint8_t kept[sizeof(carry_)];
  const uint64_t n = end - pos_;  // < kMaxHeader
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t at = pos_ + i;
    kept[i] = at >= begin ? window[at - begin] : carry_[at - carry_at_];
  }
  std::copy(kept, kept + n, carry_);
  carry_at_ = pos_;
  carry_size_ = n;
}

Status WireScanner::Field(const uint8_t* bytes, uint64_t have) {
  const Frame top = stack_.back();
  const uint8_t* const start = bytes;
  const uint8_t* const end = bytes + std::min(top.end - pos_, std::min(have, kMaxHeader));
  const uint8_t* p = start;
  uint32_t number = 0, wire = 0;
  if (!ReadTag(&p, end, &number, &wire) || number == 0) return Malformed();
  const uint64_t room = top.end - pos_;  // bytes left in the enclosing message

  // Inside an unknown group every byte is unknown; the group ends at its own end tag.
  const FieldDescriptor* f =
      top.message == nullptr ? nullptr : top.message->FindFieldByNumber(static_cast<int>(number));
  // A known number with an unexpected wire type is kept as an unknown field by protobuf.
  const bool packed = f != nullptr && f->is_packable() && wire == kLengthDelimited;
  if (f == nullptr || (wire != NaturalWireType(f) && !packed)) {
    uint64_t size = static_cast<uint64_t>(p - start);
    switch (wire) {
      case kEndGroup:
        if (top.message != nullptr || top.group != number) return Malformed();
        stack_.pop_back();
        break;
      case kStartGroup:
        if (stack_.size() > kMaxGroupDepth) {
          return ResourceExhaustedError("payload holds unknown groups nested more than " +
                                        std::to_string(kMaxGroupDepth) + " deep");
        }
        stack_.push_back({nullptr, top.end, number});
        break;
      case kLengthDelimited: {
        uint64_t len = 0;
        if (!ReadLength(&p, end, &len)) return Malformed();
        size = static_cast<uint64_t>(p - start) + len;
        if (size > room) return Malformed();
        break;
      }
      default:
        if (!SkipScalar(&p, end, wire)) return Malformed();
        size = static_cast<uint64_t>(p - start);
    }
    pos_ += size;
    return AddUnknown(size);
  }

  if (wire != kLengthDelimited) {
    if (!SkipScalar(&p, end, wire)) return Malformed();
    pos_ += static_cast<uint64_t>(p - start);
    return f->is_repeated() ? AddNumbers(1) : Status::Ok();
  }
  uint64_t len = 0;
  if (!ReadLength(&p, end, &len)) return Malformed();
  const uint64_t header = static_cast<uint64_t>(p - start);
  if (header + len > room) return Malformed();
  const uint64_t value_at = pos_ + header;
  if (packed) {
    switch (NaturalWireType(f)) {
      case kFixed64:
      case kFixed32: {
        const uint64_t width = NaturalWireType(f) == kFixed64 ? 8 : 4;
        if (len % width != 0) return Malformed();
        pos_ = value_at + len;
        return AddNumbers(len / width);
      }
      default:
        pos_ = value_at;
        in_packed_ = true;
        packed_end_ = value_at + len;
        packed_run_ = 0;
        return Status::Ok();
    }
  }
  if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
    if (++counts_.messages > limits_.max_messages) {
      return OverLimit("messages", counts_.messages, limits_.max_messages);
    }
    pos_ = value_at;
    stack_.push_back({f->message_type(), value_at + len, 0});
    return Status::Ok();
  }
  pos_ = value_at + len;
  if (f->type() == FieldDescriptor::TYPE_STRING) {
    counts_.longest_string = std::max(counts_.longest_string, len);
    if (len > limits_.max_string_bytes) {
      return ResourceExhaustedError("payload holds a string of " + std::to_string(len) +
                                    " bytes (" + f->full_name() + "), over the limit of " +
                                    std::to_string(limits_.max_string_bytes));
    }
  }
  if (f->is_repeated() && ++counts_.repeated_strings > limits_.max_repeated_strings) {
    return OverLimit("repeated strings", counts_.repeated_strings, limits_.max_repeated_strings);
  }
  return Status::Ok();
}

Status WireScanner::Finish() const {
  if (!error_.ok()) return error_;
  return done_ ? Status::Ok() : Malformed();
}

Status CheckWireLimits(std::string_view serialized, const ContentLimits& limits,
                       WireCounts* counts) {
  WireScanner scanner(limits, serialized.size());
  Status s = scanner.Advance(serialized.data(), serialized.size());
  if (s.ok()) s = scanner.Finish();
  if (counts != nullptr) *counts = scanner.counts();
  return s;
}

}  // namespace capsule::internal
