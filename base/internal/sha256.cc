#include "capsule/base/internal/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>

namespace capsule {
namespace {

// kInternal with OpenSSL's reason (its error queue is emptied, so a later call starts clean).
Status HashError() {
  std::string reason;
  unsigned long e = 0;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (reason.empty()) reason = buf;
  }
  return InternalError("cannot compute SHA-256: " +
                       (reason.empty() ? std::string("OpenSSL failed") : "OpenSSL: " + reason) +
                       "; check the OpenSSL configuration (OPENSSL_CONF) loads the default "
                       "provider");
}

}  // namespace

struct Sha256Hasher::Ctx {
  EVP_MD_CTX* md = nullptr;
  bool ok = false;  // the context is initialised and every step so far succeeded
  ~Ctx() { EVP_MD_CTX_free(md); }
  void Init() { ok = md != nullptr && EVP_DigestInit_ex(md, EVP_sha256(), nullptr) == 1; }
};

Sha256Hasher::Sha256Hasher() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  ctx_->Init();
}

Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::Update(const void* data, size_t size) {
  if (size > 0 && ctx_->ok) ctx_->ok = EVP_DigestUpdate(ctx_->md, data, size) == 1;
}

void Sha256Hasher::Update(std::string_view data) { Update(data.data(), data.size()); }

StatusOr<std::string> Sha256Hasher::Finish() {
  std::string out(kSha256Size, '\0');
  unsigned int len = 0;
  const bool ok =
      ctx_->ok &&
      EVP_DigestFinal_ex(ctx_->md, reinterpret_cast<unsigned char*>(out.data()), &len) == 1 &&
      len == kSha256Size;
  Status failed = ok ? Status::Ok() : HashError();
  ctx_->Init();
  if (!ok) return failed;
  return out;
}

StatusOr<std::string> Sha256(std::string_view data) {
  std::string out(kSha256Size, '\0');
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(out.data()), &len,
                 EVP_sha256(), nullptr) != 1 ||
      len != kSha256Size) {
    return HashError();
  }
  return out;
}

StatusOr<std::string> Sha256Hex(std::string_view data) {
  CAPSULE_ASSIGN_OR_RETURN(std::string raw, Sha256(data));
  return HexEncode(raw);
}

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
