#include "capsule/base/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>

namespace capsule {

struct Sha256Hasher::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256Hasher::Sha256Hasher() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  // Allocation failure here leaves no sensible way on; OpenSSL aborts on OOM in practice too.
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) std::abort();
}

Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::Update(const void* data, size_t size) {
  if (size > 0) EVP_DigestUpdate(ctx_->md, data, size);
}

void Sha256Hasher::Update(std::string_view data) { Update(data.data(), data.size()); }

std::string Sha256Hasher::Finish() {
  std::string out(kSha256Size, '\0');
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, reinterpret_cast<unsigned char*>(out.data()), &len);
  EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr);
  return out;
}

std::string Sha256(std::string_view data) {
  std::string out(kSha256Size, '\0');
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(out.data()), &len,
             EVP_sha256(), nullptr);
  return out;
}

std::string Sha256Hex(std::string_view data) { return HexEncode(Sha256(data)); }

std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.resize(bytes.size() * 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 0xf];
  }
  return out;
}

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

bool IsSha256Hex(std::string_view s) {
  if (s.size() != 2 * kSha256Size) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace capsule
