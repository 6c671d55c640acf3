#include "capsule/format/version.h"

#include <google/protobuf/stubs/common.h>
#include <openssl/crypto.h>

#include "capsule/format/internal/zstd_codec.h"

namespace capsule {

const char* CapsuleVersion() { return CAPSULE_VERSION; }

std::map<std::string, std::string> FormatLibraryVersions() {
  return {
      {"protobuf", google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION)},
      {"zstd", internal::ZstdVersion()},
      {"openssl", OpenSSL_version(OPENSSL_VERSION)},
  };
}

}  // namespace capsule
