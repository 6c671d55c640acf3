// The full-reader fuzz target: DecodeCapsule with every check, validation and tensor digests on,
// over inputs taken as serialized capsule.v1.Capsule messages (sealed here, so every mutation
// reaches the limits, protobuf and ValidateCapsule) or, when they start with the magic, as
// capsule files re-sealed under a fresh digest. Invariants, each abort()ing when broken:
// - the wire pass gives the same verdict whether the bytes arrive at once or in pieces;
// - it calls corrupt only what protobuf cannot parse either;
// - an accepted capsule holds what every consumer relies on, checked here independently of
//   ValidateCapsule: known enum values, sized tensors, sane times, an anomalous layer that exists;
// - the writer accepts it, and the reader accepts what the writer wrote, with the same content.
#include <google/protobuf/descriptor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/dtype.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/wire_limits.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
namespace {

// The wire pass over `serialized`, fed in pieces of `piece` bytes, as decompression feeds it.
Status ScanInPieces(std::string_view serialized, const ContentLimits& limits, size_t piece) {
  internal::WireScanner scanner(limits, serialized.size());
  for (size_t done = 0; done < serialized.size();) {
    done = std::min(serialized.size(), done + piece);
    CAPSULE_RETURN_IF_ERROR(scanner.Advance(serialized.data(), done));
  }
  if (serialized.empty()) CAPSULE_RETURN_IF_ERROR(scanner.Advance(serialized.data(), 0));
  return scanner.Finish();
}

bool EnumsKnown(const google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
        const int v = f->is_repeated() ? r->GetRepeatedEnumValue(m, f, i) : r->GetEnumValue(m, f);
        if (f->enum_type()->FindValueByNumber(v) == nullptr) return false;
      } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
                 !EnumsKnown(f->is_repeated() ? r->GetRepeatedMessage(m, f, i)
                                              : r->GetMessage(m, f))) {
        return false;
      }
    }
  }
  return true;
}

// What consumers (report, replay, inspect) assume of any capsule a reader hands them.
void CheckConsumable(const v1::Capsule& c) {
  if (!EnumsKnown(c)) Fail("accepted an unknown enum value", Status());
  constexpr int64_t k2000 = int64_t{946684800} * 1000000, k2200 = int64_t{7258118400} * 1000000;
  if (c.created_unix_micros() < k2000 || c.created_unix_micros() >= k2200) {
    Fail("accepted an absurd creation time", Status());
  }
  for (const v1::TensorBlob& t : c.tensors()) {
    const int size = DTypeElementSize(t.meta().dtype());
    if (size == 0) Fail("accepted a tensor whose elements have no size", Status());
    uint64_t numel = 1;
    for (int64_t d : t.meta().shape()) {
      if (d < 0) Fail("accepted a negative dimension", Status());
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * static_cast<uint64_t>(size) != t.data().size()) {
      Fail("accepted tensor data of the wrong size", Status());
    }
    for (int64_t s : t.meta().strides()) {
      if (s < 0 || s > (int64_t{1} << 36)) Fail("accepted an absurd stride", Status());
    }
    if (t.meta().storage_offset() < 0 || t.meta().storage_offset() >= (int64_t{1} << 36)) {
      Fail("accepted an absurd storage offset", Status());
    }
  }
  const v1::Numerics& n = c.numerics();
  if (!n.first_anomalous_layer().empty()) {
    bool found = false;
    for (const v1::LayerStats& l : n.layers()) {
      found = found ||
              (l.name() == n.first_anomalous_layer() && l.index() == n.first_anomalous_index());
    }
    if (!found) Fail("accepted a first anomalous layer that is not there", Status());
  } else if (n.first_anomalous_index() > 0) {
    Fail("accepted a first anomalous index without a layer", Status());
  }
}

void CheckDecode(std::string_view file, std::optional<std::string_view> serialized) {
  const ReadOptions& options = FuzzReadOptions();
  StatusOr<DecodedCapsule> d = DecodeCapsule(file, options);
  if (serialized.has_value()) {
    const Status whole = internal::CheckWireLimits(*serialized, options.limits);
    for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}}) {
      const Status pieces = ScanInPieces(*serialized, options.limits, piece);
      if (pieces.code() != whole.code()) Fail("the wire pass depends on how bytes arrive", pieces);
    }
    v1::Capsule parsed;
    const bool parses =
        parsed.ParseFromArray(serialized->data(), static_cast<int>(serialized->size()));
    if (whole.code() == StatusCode::kDataLoss && parses) {
      Fail("the wire pass refused what protobuf parses", whole);
    }
    if (d.ok() && !whole.ok()) Fail("the reader accepted what the wire pass refuses", whole);
  }
  if (!d.ok()) {
    if (d.status().code() == StatusCode::kInternal || d.status().message().empty()) {
      Fail("rejection without a proper code and message", d.status());
    }
    return;
  }
  CheckConsumable(*d->capsule);
  StatusOr<std::string> encoded = EncodeCapsule(*d->capsule, WriteOptions());
  if (!encoded.ok()) Fail("the writer refuses what the reader accepted", encoded.status());
  StatusOr<DecodedCapsule> again = DecodeCapsule(*encoded, options);
  if (!again.ok()) Fail("the reader refuses what the writer wrote", again.status());
  if (SerializeDeterministic(*again->capsule) != SerializeDeterministic(*d->capsule)) {
    Fail("a round trip changed the content", Status());
  }
}

void TestOneInput(std::string_view bytes) {
  QuietProtobuf();
  if (bytes.substr(0, kMagicSize) == kMagic) {
    CheckDecode(bytes, std::nullopt);
    if (std::optional<std::string> resealed = ResealUnsigned(bytes)) {
      CheckDecode(*resealed, std::nullopt);
    }
    return;
  }
  CheckDecode(SealMessage(bytes), bytes);
}

}  // namespace
}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  capsule::fuzz::TestOneInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
