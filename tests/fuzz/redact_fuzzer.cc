// The RedactCapsule fuzz target: whatever capsule the reader accepts (an input taken as a
// serialized message, or as a capsule file re-sealed under a fresh digest), redacted with the
// items the input's last byte picks. Invariants, each abort()ing when broken:
// - no unknown field survives, at any depth, and the bytes dropped are recorded;
// - each item removed what it promises (raw text, token ids and labels and the tensors holding
//   them, directories of file paths, the host name);
// - the record names every item dropped and the source;
// - the redacted capsule is still valid: the writer encodes it and the reader reads it back;
// - redacting it again with the same items changes nothing but the record.
#include <google/protobuf/message.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/redact.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"
#include "tests/fuzz/fuzz_common.h"

namespace capsule::fuzz {
namespace {

bool HasUnknownFields(const google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  if (!r->GetUnknownFields(m).empty()) return true;
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      if (HasUnknownFields(f->is_repeated() ? r->GetRepeatedMessage(m, f, i)
                                            : r->GetMessage(m, f))) {
        return true;
      }
    }
  }
  return false;
}

bool Dropped(const v1::Capsule& c, const char* item) {
  for (const std::string& d : c.redaction().dropped()) {
    if (d == item) return true;
  }
  return false;
}

void CheckRedaction(const v1::Capsule& source, uint8_t choice) {
  RedactOptions options;
  options.text = (choice & 1) != 0;
  options.tokens = (choice & 2) != 0;
  options.paths = (choice & 4) != 0;
  options.host = (choice & 8) != 0 || (choice & 15) == 0;  // at least one item
  options.source_sha256 = *Sha256Hex("source");
  options.now_unix_micros = 1700000000000000;
  v1::Capsule c = source;
  const bool had_unknown = HasUnknownFields(c);
  if (Status s = RedactCapsule(&c, options); !s.ok()) Fail("redaction failed", s);

  if (HasUnknownFields(c)) Fail("an unknown field survived redaction", Status());
  const uint64_t recorded = c.redaction().unknown_field_bytes_dropped() -
                            source.redaction().unknown_field_bytes_dropped();
  if (had_unknown != (recorded > 0)) Fail("unknown bytes dropped are not recorded", Status());
  for (const v1::Sequence& s : c.data().sequences()) {
    if (options.text && (!s.raw_text().empty() || !s.raw_bytes().empty())) {
      Fail("raw text survived", Status());
    }
    if (options.tokens && (s.token_ids_size() != 0 || s.labels_size() != 0)) {
      Fail("token ids or labels survived", Status());
    }
  }
  if (options.tokens) {
    for (const v1::TensorBlob& t : c.tensors()) {
      if (t.role() == v1::BATCH_INPUT && (t.name() == "input_ids" || t.name() == "labels")) {
        Fail("a token tensor survived", Status());
      }
    }
  }
  if (options.paths) {
    for (const v1::FileIdentity& f : c.identity().files()) {
      if (f.path().find('/') != std::string::npos && f.path() != "/") {
        Fail("a directory survived in a file path", Status());
      }
    }
  }
  if (options.host && !c.environment().hostname().empty()) Fail("the host survived", Status());
  const std::pair<bool, const char*> items[] = {{options.text, "text"},
                                                {options.tokens, "tokens"},
                                                {options.paths, "paths"},
                                                {options.host, "host"}};
  for (const auto& [chosen, item] : items) {
    if (chosen && !Dropped(c, item)) Fail("an item dropped is not recorded", Status());
  }
  if (c.redaction().source_sha256() != options.source_sha256) Fail("source not recorded", Status());

  if (Status v = ValidateCapsule(c); !v.ok()) Fail("redaction made the capsule invalid", v);
  StatusOr<std::string> encoded = EncodeCapsule(c, WriteOptions());
  if (!encoded.ok()) Fail("the writer refuses a redacted capsule", encoded.status());
  if (!DecodeCapsule(*encoded, FuzzReadOptions()).ok()) {
    Fail("the reader refuses a redacted capsule", Status());
  }

  v1::Capsule twice = c;
  if (Status s = RedactCapsule(&twice, options); !s.ok()) Fail("second redaction failed", s);
  twice.clear_redaction();
  v1::Capsule once = c;
  once.clear_redaction();
  if (SerializeDeterministic(twice) != SerializeDeterministic(once)) {
    Fail("redacting twice changed more than the record", Status());
  }
}

void TestOneInput(std::string_view bytes) {
  QuietProtobuf();
  if (bytes.empty()) return;
  const uint8_t choice = static_cast<uint8_t>(bytes.back());
  if (std::optional<DecodedCapsule> d = DecodeFuzzInput(bytes)) CheckRedaction(*d->capsule, choice);
}

}  // namespace
}  // namespace capsule::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  capsule::fuzz::TestOneInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
