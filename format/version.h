// Versions of capsule and of the libraries the format layer links, for the environment
// fingerprint and `capsule --version`.
//
//   for (const auto& [name, version] : capsule::FormatLibraryVersions()) ...
//
// Thread safety: thread-safe.
#ifndef CAPSULE_FORMAT_VERSION_H_
#define CAPSULE_FORMAT_VERSION_H_

#include <map>
#include <string>

namespace capsule {

// "0.1.0"
const char* CapsuleVersion();
// {"protobuf": "3.21.12", "zstd": "1.5.4", "openssl": "OpenSSL 3.0.x ..."}
std::map<std::string, std::string> FormatLibraryVersions();

}  // namespace capsule

#endif  // CAPSULE_FORMAT_VERSION_H_
