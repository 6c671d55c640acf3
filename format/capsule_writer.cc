#include "capsule/format/capsule_writer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream.h>
#include <google/protobuf/wire_format.h>
#include <google/protobuf/wire_format_lite.h>

#include <cctype>
#include <climits>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "capsule/base/internal/byte_buffer.h"
#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/wire_limits.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

// The serialized capsule as protobuf writes it, compressed as it comes. Small fields are gathered
// in a buffer; bytes and string fields longer than what is left of it are handed over where they
// lie in the message (aliasing), so tensor data goes from the message straight into zstd, never
// copied into a serialized buffer first. The reader's wire pass runs on the same bytes on the way.
class CompressingStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  CompressingStream(internal::ZstdFrameWriter* writer, internal::WireScanner* scanner)
      : writer_(writer), scanner_(scanner), buffer_(new char[kBufferSize]) {}

  bool Next(void** data, int* size) override {
    if (!Commit()) return false;
    *data = buffer_.get();
    *size = static_cast<int>(kBufferSize);
    lent_ = kBufferSize;
    return true;
  }
  void BackUp(int count) override { lent_ -= static_cast<size_t>(count); }
  int64_t ByteCount() const override { return static_cast<int64_t>(written_ + lent_); }
  bool AllowsAliasing() const override { return true; }
  bool WriteAliasedRaw(const void* data, int size) override {
    return Commit() &&
           Consume(std::string_view(static_cast<const char*>(data), static_cast<size_t>(size)));
  }

  // Once the CodedOutputStream is gone (it gives back what it did not use when destroyed).
  void Flush() { Commit(); }
  // The first limit the bytes broke, and the first error of zstd or of the sink.
  const Status& scan_status() const { return scan_; }
  const Status& compress_status() const { return compress_; }

 private:
  static constexpr size_t kBufferSize = size_t{64} << 10;

  bool Commit() {
    const size_t n = lent_;
    lent_ = 0;
    return Consume(std::string_view(buffer_.get(), n));
  }
  bool Consume(std::string_view piece) {
    if (!scan_.ok() || !compress_.ok()) return false;
    if (piece.empty()) return true;
    scan_ = scanner_->Advance(piece.data(), written_, written_ + piece.size());
    if (scan_.ok()) compress_ = writer_->Write(piece);
    written_ += piece.size();
    return scan_.ok() && compress_.ok();
  }

  internal::ZstdFrameWriter* const writer_;
  internal::WireScanner* const scanner_;
  std::unique_ptr<char[]> buffer_;
  size_t lent_ = 0;       // bytes of buffer_ the serializer holds
  uint64_t written_ = 0;  // bytes passed on to the scan and zstd
  Status scan_;
  Status compress_;
};

// EncodeInto's output when it is a string: EncodeCapsule's result.
class StringWriter final : public AtomicFileWriter {
 public:
  explicit StringWriter(std::string* out) : out_(out) {}
  Status Append(std::string_view bytes) override {
    out_->append(bytes);
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, std::string_view bytes) override {
    if (offset + bytes.size() > out_->size()) return InternalError("rewriting bytes not written");
    out_->replace(offset, bytes.size(), bytes);
    return Status::Ok();
  }

 private:
  std::string* const out_;
};

using google::protobuf::internal::WireFormat;
using google::protobuf::internal::WireFormatLite;

// TensorBlob.data's tag: field 3, length-delimited.
constexpr uint32_t kBlobDataTag = 3 << 3 | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;

// The view that stands for tensors(i).data, empty when its bytes are in the message.
std::string_view ViewOf(const WriteOptions& options, int i) {
  return options.tensor_data == nullptr ? std::string_view() : (*options.tensor_data)[i];
}

// What the serialized message grows by when the views are written as its tensors' data: each
// blob by the data field, the capsule by that and the longer length prefix of the blob. Needs the
// sizes ByteSizeLong cached.
size_t ViewsSize(const v1::Capsule& capsule, const WriteOptions& options) {
  size_t extra = 0;
  for (int i = 0; i < capsule.tensors_size(); ++i) {
    const std::string_view v = ViewOf(options, i);
    if (v.empty()) continue;
    const size_t blob = static_cast<size_t>(capsule.tensors(i).GetCachedSize());
    const size_t field = 1 + WireFormatLite::LengthDelimitedSize(v.size());
    extra += field + WireFormatLite::UInt64Size(blob + field) - WireFormatLite::UInt64Size(blob);
  }
  return extra;
}

// The message with the views in place, as SerializeWithCachedSizes writes it with the fields
// filled in: fields in number order (as generated code and deterministic serialization order
// them), every field but the tensors' data as protobuf writes it, and the data of a blob whose
// bytes are outside the message written between its fields 2 and 4, aliased, so the bytes go
// from where they lie straight into zstd.
void SerializeWithViews(const v1::Capsule& capsule, const WriteOptions& options,
                        google::protobuf::io::CodedOutputStream* out) {
  const google::protobuf::Reflection* reflection = capsule.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(capsule, &fields);  // sorted by number
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->number() != v1::Capsule::kTensorsFieldNumber) {
      WireFormat::SerializeFieldWithCachedSizes(field, capsule, out);
      continue;
    }
    for (int i = 0; i < capsule.tensors_size(); ++i) {
      const v1::TensorBlob& blob = capsule.tensors(i);
      const std::string_view v = ViewOf(options, i);
      if (v.empty()) {
        WireFormatLite::WriteMessage(field->number(), blob, out);
        continue;
      }
      const size_t data_field = 1 + WireFormatLite::LengthDelimitedSize(v.size());
      WireFormatLite::WriteTag(field->number(), WireFormatLite::WIRETYPE_LENGTH_DELIMITED, out);
      out->WriteVarint64(static_cast<uint64_t>(blob.GetCachedSize()) + data_field);
      std::vector<const google::protobuf::FieldDescriptor*> blob_fields;
      blob.GetReflection()->ListFields(blob, &blob_fields);
      bool data_written = false;
      auto write_data = [&] {
        out->WriteVarint32(kBlobDataTag);
        out->WriteVarint64(v.size());
        out->WriteRawMaybeAliased(v.data(), static_cast<int>(v.size()));
        data_written = true;
      };
      for (const google::protobuf::FieldDescriptor* f : blob_fields) {
        if (!data_written && f->number() > v1::TensorBlob::kDataFieldNumber) write_data();
        WireFormat::SerializeFieldWithCachedSizes(f, blob, out);
      }
      if (!data_written) write_data();
      WireFormat::SerializeUnknownFields(blob.GetReflection()->GetUnknownFields(blob), out);
    }
  }
  WireFormat::SerializeUnknownFields(reflection->GetUnknownFields(capsule), out);
}

// What is refused before anything is written: the content rules, and protobuf's size limit.
// Returns the size of the serialized message.
StatusOr<size_t> CheckWritable(const v1::Capsule& capsule, const WriteOptions& options) {
  // Checked whether or not the content rules are: the serializer relies on it.
  CAPSULE_RETURN_IF_ERROR(CheckTensorDataViews(capsule, options.tensor_data));
  if (options.validate) {
    ValidateOptions vopts;
    vopts.verify_tensor_digests = options.verify_tensor_digests;
    vopts.tensor_data = options.tensor_data;
    Status s = ValidateCapsule(capsule, vopts);
    if (!s.ok()) return s.WithContext("refusing to write an invalid capsule");
  }
  const size_t size = capsule.ByteSizeLong() + ViewsSize(capsule, options);
  if (size > static_cast<size_t>(INT_MAX)) {
    return ResourceExhaustedError("capsule of " + std::to_string(size) +
                                  " bytes is over protobuf's 2 GiB message limit; embed fewer "
                                  "tensors (weight policy) or lower the size cap");
  }
  return size;
}

// Encodes `capsule`, whose serialized size ByteSizeLong just gave as `size`, into `out`: a
// header's room, the frame as zstd makes it, the trailer, then the header. One pass over the
// tensor bytes: serialization hands them to zstd where they lie, and each piece of the frame is
// hashed for the digest while it is still in cache, then written out.
Status EncodeInto(const v1::Capsule& capsule, size_t size, const WriteOptions& options,
                  AtomicFileWriter& out) {
  SealOptions seal;
  seal.signing_key = options.signing_key;
  seal.optional_flags = options.optional_flags;
  const size_t header_size = SealedHeaderSize(seal);
  CAPSULE_RETURN_IF_ERROR(out.Append(std::string(header_size, '\0')));
  Sha256Hasher payload_sha256;
  uint64_t payload_size = 0;
  internal::CompressOptions copts;
  copts.level = options.compression_level;
  copts.workers = options.compression_workers;
  CAPSULE_ASSIGN_OR_RETURN(std::unique_ptr<internal::ZstdFrameWriter> frame,
                           internal::ZstdFrameWriter::Start(size, copts, [&](std::string_view p) {
                             payload_sha256.Update(p);
                             payload_size += p.size();
                             return out.Append(p);
                           }));
  // A capsule the default reader would refuse is refused here, while the writer can still say so.
  const ContentLimits limits;
  internal::WireScanner scanner(limits, size);
  CompressingStream stream(frame.get(), &scanner);
  {
    // Deterministic serialization orders map entries; without it two encodes of one message can
    // differ, and byte-identical re-encoding is a format promise.
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    coded.EnableAliasing(true);
    if (options.tensor_data == nullptr) {
      capsule.SerializeWithCachedSizes(&coded);
    } else {
      SerializeWithViews(capsule, options, &coded);
    }
  }
  stream.Flush();
  constexpr char kReadersRefuse[] = "refusing to write a capsule readers refuse";
  if (!stream.scan_status().ok()) return stream.scan_status().WithContext(kReadersRefuse);
  CAPSULE_RETURN_IF_ERROR(stream.compress_status());
  if (static_cast<size_t>(stream.ByteCount()) != size) {
    return InternalError("cannot serialize the capsule");
  }
  if (Status s = scanner.Finish(); !s.ok()) return s.WithContext(kReadersRefuse);
  CAPSULE_RETURN_IF_ERROR(frame->Finish());
  CAPSULE_ASSIGN_OR_RETURN(const std::string payload_digest, payload_sha256.Finish());
  CAPSULE_ASSIGN_OR_RETURN(SealedParts parts,
                           SealEnvelopeParts(payload_size, size, payload_digest, seal));
  CAPSULE_RETURN_IF_ERROR(out.Append(parts.trailer));
  return out.WriteAt(0, parts.header);
}

}  // namespace

StatusOr<std::string> EncodeCapsule(const v1::Capsule& capsule, const WriteOptions& options) {
  CAPSULE_ASSIGN_OR_RETURN(const size_t size, CheckWritable(capsule, options));
  // Sized once for the worst case, so the output never moves while it is written.
  std::string out;
  out.reserve(kHeaderSizeV1SignerKey + internal::ZstdCompressBound(size) + kTrailerFixedSize +
              kEd25519SignatureSize);
  AdviseHugePages(out.data(), out.capacity());
  StringWriter writer(&out);
  CAPSULE_RETURN_IF_ERROR(EncodeInto(capsule, size, options, writer));
  return out;
}

Status WriteCapsuleFile(const std::string& path, const v1::Capsule& capsule,
                        const WriteOptions& options) {
  // Refused before a file is made, as an invalid capsule always was.
  CAPSULE_ASSIGN_OR_RETURN(const size_t size, CheckWritable(capsule, options));
  AtomicWriteOptions file;
  file.overwrite = options.overwrite;
  // Streamed to the temporary file: the capsule goes to disk while it is encoded, and is never
  // held whole in memory (it can be as large as the embedded tensors).
  return WriteFileAtomicWith(
      path, [&](AtomicFileWriter& out) { return EncodeInto(capsule, size, options, out); }, file);
}

std::string CapsuleFileName(const std::string& run, int64_t step, int rank,
                            const std::string& trigger_kind_name) {
  std::string safe_run = run.empty() ? "run" : run;
  for (char& c : safe_run) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  }
  std::string trigger;
  for (char c : trigger_kind_name) {
    trigger += c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return safe_run + "-step" + std::to_string(step) + "-rank" + std::to_string(rank) + "-" +
         trigger + ".capsule";
}

}  // namespace capsule
