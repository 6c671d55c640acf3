// SHA-256 and hex helpers (OpenSSL's implementation; SHA-NI where the CPU has it).
//
// Capsules identify everything by SHA-256: files, the canonical model hash, tensor blobs, signer
// keys. Hashes appear as lowercase hex (64 characters) in the schema and raw (32 bytes) in the
// envelope.
//
// Hashing fails closed: OpenSSL can fail to hash (no provider with SHA-256 loaded, as with an
// OPENSSL_CONF that activates none; no memory), and a digest that was not computed must never
// compare equal to one stored in a capsule, so every function that hashes returns kInternal
// "cannot compute SHA-256: ..." instead of a digest in that case.
//
//   CAPSULE_ASSIGN_OR_RETURN(std::string hex, capsule::Sha256Hex(bytes));
//   capsule::Sha256Hasher h;  h.Update(a);  h.Update(b);
//   CAPSULE_ASSIGN_OR_RETURN(std::string raw, h.Finish());
//
// Thread safety: the free functions are thread-safe; a Sha256Hasher is used by one thread.
#ifndef CAPSULE_BASE_INTERNAL_SHA256_H_
#define CAPSULE_BASE_INTERNAL_SHA256_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "capsule/base/status.h"

namespace capsule {

inline constexpr size_t kSha256Size = 32;

// The raw 32-byte digest of `data`; kInternal when OpenSSL cannot compute it.
StatusOr<std::string> Sha256(std::string_view data);
// The digest as 64 lowercase hex characters; kInternal when OpenSSL cannot compute it.
StatusOr<std::string> Sha256Hex(std::string_view data);

class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  // A failure (OpenSSL's) is kept and returned by Finish(); later updates are ignored.
  void Update(std::string_view data);
  void Update(const void* data, size_t size);
  // Raw 32-byte digest of everything given since construction or the last Finish(); kInternal
  // when any step failed. The hasher is reset afterwards and can be reused.
  StatusOr<std::string> Finish();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string HexEncode(std::string_view bytes);
// nullopt when `hex` has odd length or a non-hex character. Accepts upper and lower case.
std::optional<std::string> HexDecode(std::string_view hex);
// True for exactly 64 lowercase hex characters.
bool IsSha256Hex(std::string_view s);

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_SHA256_H_
