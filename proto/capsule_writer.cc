#include "proto/capsule_writer.h"

#include <cctype>

#include "proto/capsule.pb.h"
#include "proto/envelope.h"
#include "proto/file_util.h"
#include "proto/internal/zstd_codec.h"
#include "proto/validate.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace capsule {

StatusOr<std::string> EncodeCapsule(const v1::Capsule& capsule, const WriteOptions& options) {
  if (options.validate) {
    Status s = ValidateCapsule(capsule);
    if (!s.ok()) return s.WithContext("refusing to write an invalid capsule");
  }
  std::string serialized;
  {
    // Deterministic serialization orders map entries; without it two encodes of one message can
    // differ, and byte-identical re-encoding is a format promise.
    google::protobuf::io::StringOutputStream stream(&serialized);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!capsule.SerializeToCodedStream(&coded)) {
      return InternalError("cannot serialize the capsule (over 2 GiB?)");
    }
  }
  internal::CompressOptions copts;
  copts.level = options.compression_level;
  copts.workers = options.compression_workers;
  CAPSULE_ASSIGN_OR_RETURN(std::string frame, internal::ZstdCompress(serialized, copts));
  SealOptions seal;
  seal.signing_key = options.signing_key;
  seal.optional_flags = options.optional_flags;
  return SealEnvelope(frame, serialized.size(), seal);
}

Status WriteCapsuleFile(const std::string& path, const v1::Capsule& capsule,
                        const WriteOptions& options) {
  CAPSULE_ASSIGN_OR_RETURN(std::string bytes, EncodeCapsule(capsule, options));
  return WriteFileAtomic(path, bytes);
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
