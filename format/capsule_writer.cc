#include "capsule/format/capsule_writer.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <cctype>
#include <climits>
#include <memory>
#include <new>

#include "capsule/base/file_util.h"
#include "capsule/format/envelope.h"
#include "capsule/format/envelope_format.h"
#include "capsule/format/internal/wire_limits.h"
#include "capsule/format/internal/zstd_codec.h"
#include "capsule/format/validate.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {

StatusOr<std::string> EncodeCapsule(const v1::Capsule& capsule, const WriteOptions& options) {
  if (options.validate) {
    Status s = ValidateCapsule(capsule);
    if (!s.ok()) return s.WithContext("refusing to write an invalid capsule");
  }
  // Serialize into an exact-size buffer and compress straight into the output: a capsule can
  // carry hundreds of MiB of tensors, and each extra copy costs as much as the compression.
  const size_t size = capsule.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX)) {
    return ResourceExhaustedError("capsule of " + std::to_string(size) +
                                  " bytes is over protobuf's 2 GiB message limit; embed fewer "
                                  "tensors (weight policy) or lower the size cap");
  }
  std::unique_ptr<char[]> serialized(new (std::nothrow) char[size == 0 ? 1 : size]);
  if (!serialized)
    return ResourceExhaustedError("cannot allocate " + std::to_string(size) + " bytes");
  {
    // Deterministic serialization orders map entries; without it two encodes of one message can
    // differ, and byte-identical re-encoding is a format promise.
    google::protobuf::io::ArrayOutputStream stream(serialized.get(), static_cast<int>(size));
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    capsule.SerializeWithCachedSizes(&coded);
    if (coded.HadError() || static_cast<size_t>(coded.ByteCount()) != size) {
      return InternalError("cannot serialize the capsule");
    }
  }
  // A capsule the default reader would refuse is refused here, while the writer can still say so.
  {
    Status limits =
        internal::CheckWireLimits(std::string_view(serialized.get(), size), ContentLimits());
    if (!limits.ok()) return limits.WithContext("refusing to write a capsule readers refuse");
  }
  internal::CompressOptions copts;
  copts.level = options.compression_level;
  copts.workers = options.compression_workers;
  SealOptions seal;
  seal.signing_key = options.signing_key;
  seal.optional_flags = options.optional_flags;
  const size_t header_size = SealedHeaderSize(seal);
  const size_t bound = internal::ZstdCompressBound(size);
  std::string out;
  out.reserve(header_size + bound + kTrailerFixedSize + kEd25519SignatureSize);
  out.resize(header_size + bound);
  CAPSULE_ASSIGN_OR_RETURN(size_t frame_size,
                           internal::ZstdCompressInto(std::string_view(serialized.get(), size),
                                                      &out[header_size], bound, copts));
  out.resize(header_size + frame_size);
  CAPSULE_RETURN_IF_ERROR(SealEnvelopeInPlace(&out, size, seal));
  return out;
}

Status WriteCapsuleFile(const std::string& path, const v1::Capsule& capsule,
                        const WriteOptions& options) {
  CAPSULE_ASSIGN_OR_RETURN(std::string bytes, EncodeCapsule(capsule, options));
  AtomicWriteOptions file;
  file.overwrite = options.overwrite;
  return WriteFileAtomic(path, bytes, file);
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
