// SHA-256 and hex helpers (OpenSSL's implementation; SHA-NI where the CPU has it).
//
// Capsules identify everything by SHA-256: files, the canonical model hash, tensor blobs, signer
// keys. Hashes appear as lowercase hex (64 characters) in the schema and raw (32 bytes) in the
// envelope.
//
//   std::string hex = capsule::Sha256Hex(bytes);
//   capsule::Sha256Hasher h;  h.Update(a);  h.Update(b);  std::string raw = h.Finish();
//
// Thread safety: the free functions are thread-safe; a Sha256Hasher is used by one thread.
#ifndef CAPSULE_BASE_SHA256_H_
#define CAPSULE_BASE_SHA256_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace capsule {

inline constexpr size_t kSha256Size = 32;

// The raw 32-byte digest of `data`.
std::string Sha256(std::string_view data);
// The digest as 64 lowercase hex characters.
std::string Sha256Hex(std::string_view data);

class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view data);
  void Update(const void* data, size_t size);
  // Raw 32-byte digest. The hasher is reset afterwards and can be reused.
  std::string Finish();

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

#endif  // CAPSULE_BASE_SHA256_H_
