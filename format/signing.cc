#include "capsule/format/signing.h"

#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"

namespace capsule {
namespace {

struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown openssl error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

std::string BioToString(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

// A public key where a private one is expected is a common slip (run.pub for run.key); say so
// instead of "not a private key", or, for a 0644 file, "readable by others".
bool IsPublicKeyPem(std::string_view pem) {
  return pem.find("-----BEGIN PUBLIC KEY-----") != std::string_view::npos;
}

// OpenSSL's default pass phrase callback prompts on the terminal ("Enter PEM pass phrase:"): a
// trainer or a CLI run must never stop to ask. This one refuses and records that it was asked.
int RefusePassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* asked) {
  *static_cast<bool*>(asked) = true;
  return -1;
}

StatusOr<std::string> RawKey(EVP_PKEY* pkey, bool is_private) {
  if (EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519) {
    return InvalidArgumentError("not an Ed25519 key");
  }
  std::string raw(kEd25519KeySize, '\0');
  size_t len = raw.size();
  const int ok =
      is_private
          ? EVP_PKEY_get_raw_private_key(pkey, reinterpret_cast<unsigned char*>(raw.data()), &len)
          : EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<unsigned char*>(raw.data()), &len);
  if (ok != 1 || len != kEd25519KeySize) {
    return InvalidArgumentError("cannot read the raw Ed25519 key: " + OpenSslError());
  }
  return raw;
}

struct BnCtxDeleter {
  void operator()(BN_CTX* c) const { BN_CTX_free(c); }
};
struct BnDeleter {
  void operator()(BIGNUM* b) const { BN_free(b); }
};
using BnPtr = std::unique_ptr<BIGNUM, BnDeleter>;

// The y coordinates (little-endian, sign bit clear) of the eight points of small order, whose
// encodings are every public key a signature can be forged for without a private key: 1 (the
// identity), p-1 (order 2), 0 (order 4, two points), and the two of order 8 (libsodium's
// blocklist, less its non-canonical entries, which the canonical check refuses first).
constexpr unsigned char kSmallOrderY[][kEd25519KeySize] = {
    {0x00},
    {0x01},
    {0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
    {0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4,
     0x89, 0xf2, 0xef, 0x98, 0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6,
     0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53, 0xfc, 0x05},
    {0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b,
     0x76, 0x0d, 0x10, 0x67, 0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39,
     0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac, 0x03, 0x7a},
};

// RFC 8032 §5.1.3 decoding of a public key, without keeping the point: the point must not be of
// small order, y must be below p = 2^255 - 19, and x^2 = (y^2 - 1) / (d y^2 + 1) must have a root
// (Euler's criterion).
Status CheckEd25519PublicKey(std::string_view raw) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(raw.data());
  unsigned char y_le[kEd25519KeySize];
  std::memcpy(y_le, bytes, kEd25519KeySize);
  y_le[kEd25519KeySize - 1] &= 0x7f;  // the sign of x
  const std::string invalid = "not a valid Ed25519 public key: ";
  for (const auto& small : kSmallOrderY) {
    if (std::memcmp(y_le, small, kEd25519KeySize) == 0) {
      return InvalidArgumentError(invalid +
                                  "a point of small order, for which anyone can make a signature "
                                  "that verifies");
    }
  }
  std::unique_ptr<BN_CTX, BnCtxDeleter> ctx(BN_CTX_new());
  BnPtr p(BN_new()), y(BN_lebin2bn(y_le, kEd25519KeySize, nullptr)), d(BN_new()), t(BN_new()),
      u(BN_new()), v(BN_new()), w(BN_new()), one(BN_new());
  const auto failed = [] {
    return InternalError("cannot check the public key: " + OpenSslError());
  };
  if (!ctx || !p || !y || !d || !t || !u || !v || !w || !one) return failed();
  // p = 2^255 - 19; d = -121665 / 121666 mod p.
  if (BN_set_word(one.get(), 1) != 1 || BN_lshift(p.get(), one.get(), 255) != 1 ||
      BN_sub_word(p.get(), 19) != 1) {
    return failed();
  }
  if (BN_cmp(y.get(), p.get()) >= 0) {
    return InvalidArgumentError(invalid + "y is not below 2^255-19 (a non-canonical encoding)");
  }
  if (BN_set_word(t.get(), 121666) != 1 ||
      BN_mod_inverse(d.get(), t.get(), p.get(), ctx.get()) == nullptr ||
      BN_set_word(t.get(), 121665) != 1 ||
      BN_mod_mul(d.get(), d.get(), t.get(), p.get(), ctx.get()) != 1 ||
      BN_mod_sub(d.get(), p.get(), d.get(), p.get(), ctx.get()) != 1) {
    return failed();
  }
  // u = y^2 - 1, v = d y^2 + 1 (never 0: d is not a square), w = u / v.
  if (BN_mod_sqr(t.get(), y.get(), p.get(), ctx.get()) != 1 ||
      BN_mod_sub(u.get(), t.get(), one.get(), p.get(), ctx.get()) != 1 ||
      BN_mod_mul(v.get(), d.get(), t.get(), p.get(), ctx.get()) != 1 ||
      BN_mod_add(v.get(), v.get(), one.get(), p.get(), ctx.get()) != 1 ||
      BN_mod_inverse(v.get(), v.get(), p.get(), ctx.get()) == nullptr ||
      BN_mod_mul(w.get(), u.get(), v.get(), p.get(), ctx.get()) != 1) {
    return failed();
  }
  // w = x^2 is a square iff w^((p-1)/2) = 1. (w = 0, x = 0, only for y = 1 or p-1: small order,
  // refused above, as is the sign bit RFC 8032 forbids with x = 0.)
  if (BN_copy(t.get(), p.get()) == nullptr || BN_sub_word(t.get(), 1) != 1 ||
      BN_rshift1(t.get(), t.get()) != 1 ||
      BN_mod_exp(t.get(), w.get(), t.get(), p.get(), ctx.get()) != 1) {
    return failed();
  }
  if (!BN_is_one(t.get())) return InvalidArgumentError(invalid + "not a point of the curve");
  return Status::Ok();
}

}  // namespace

StatusOr<PublicKey> PublicKey::FromRaw(std::string_view raw) {
  if (raw.size() != kEd25519KeySize) {
    return InvalidArgumentError("an Ed25519 public key is 32 bytes, got " +
                                std::to_string(raw.size()));
  }
  CAPSULE_RETURN_IF_ERROR(CheckEd25519PublicKey(raw));
  PublicKey key;
  key.raw_ = std::string(raw);
  CAPSULE_ASSIGN_OR_RETURN(key.key_id_, Sha256(raw));
  return key;
}

std::string PublicKey::KeyIdHex() const { return HexEncode(key_id_); }

StatusOr<std::string> PublicKey::ToPem() const {
  PkeyPtr pkey(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw_.data()), raw_.size()));
  if (!pkey) return InternalError("cannot build the public key: " + OpenSslError());
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PUBKEY(bio.get(), pkey.get()) != 1) {
    return InternalError("cannot write the public key PEM: " + OpenSslError());
  }
  return BioToString(bio.get());
}

PrivateKey::~PrivateKey() {
  if (!raw_.empty()) OPENSSL_cleanse(raw_.data(), raw_.size());
}

StatusOr<PrivateKey> PrivateKey::FromRaw(std::string_view raw) {
  if (raw.size() != kEd25519KeySize) {
    return InvalidArgumentError("an Ed25519 private key is 32 bytes, got " +
                                std::to_string(raw.size()));
  }
  PrivateKey key;
  key.raw_ = std::string(raw);
  return key;
}

StatusOr<PublicKey> PrivateKey::GetPublicKey() const {
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw_.data()), raw_.size()));
  if (!pkey) return InvalidArgumentError("not a usable Ed25519 private key: " + OpenSslError());
  CAPSULE_ASSIGN_OR_RETURN(std::string pub, RawKey(pkey.get(), /*is_private=*/false));
  return PublicKey::FromRaw(pub);
}

StatusOr<std::string> PrivateKey::ToPem() const {
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(raw_.data()), raw_.size()));
  if (!pkey) return InvalidArgumentError("not a usable Ed25519 private key: " + OpenSslError());
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), pkey.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return InternalError("cannot write the private key PEM: " + OpenSslError());
  }
  std::string pem = BioToString(bio.get());
  return pem;
}

StatusOr<KeyPair> GenerateKeyPair() {
  EVP_PKEY* raw_pkey = nullptr;
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), EVP_PKEY_CTX_free);
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw_pkey) != 1) {
    return InternalError("cannot generate an Ed25519 key: " + OpenSslError());
  }
  PkeyPtr pkey(raw_pkey);
  CAPSULE_ASSIGN_OR_RETURN(std::string priv, RawKey(pkey.get(), /*is_private=*/true));
  CAPSULE_ASSIGN_OR_RETURN(PrivateKey private_key, PrivateKey::FromRaw(priv));
  OPENSSL_cleanse(priv.data(), priv.size());
  CAPSULE_ASSIGN_OR_RETURN(PublicKey public_key, private_key.GetPublicKey());
  return KeyPair{std::move(private_key), std::move(public_key)};
}

StatusOr<PrivateKey> ParsePrivateKeyPem(std::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return ResourceExhaustedError("cannot allocate");
  if (IsPublicKeyPem(pem)) return InvalidArgumentError("this is a public key, not a private key");
  bool asked = false;
  PkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, RefusePassphrase, &asked));
  if (!pkey) {
    ERR_clear_error();
    if (asked) {
      return InvalidArgumentError(
          "encrypted private keys are not supported (store it decrypted, mode 0600)");
    }
    return InvalidArgumentError("not a PEM private key");
  }
  CAPSULE_ASSIGN_OR_RETURN(std::string raw, RawKey(pkey.get(), /*is_private=*/true));
  auto key = PrivateKey::FromRaw(raw);
  OPENSSL_cleanse(raw.data(), raw.size());
  return key;
}

StatusOr<PublicKey> ParsePublicKeyPem(std::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return ResourceExhaustedError("cannot allocate");
  PkeyPtr pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (!pkey) {
    ERR_clear_error();
    return InvalidArgumentError("not a PEM public key");
  }
  CAPSULE_ASSIGN_OR_RETURN(std::string raw, RawKey(pkey.get(), /*is_private=*/false));
  return PublicKey::FromRaw(raw);
}

StatusOr<PrivateKey> LoadPrivateKeyFile(const std::string& path) {
  // One open: the mode judged is the mode of the file whose bytes are used.
  auto file = ReadRegularFile(path, 1 << 16);
  if (!file.ok()) return file.status().WithContext("cannot read private key");
  struct Cleanse {
    std::string* s;
    ~Cleanse() { OPENSSL_cleanse(s->data(), s->size()); }
  } cleanse{&file->bytes};
  if (IsPublicKeyPem(file->bytes)) {
    return InvalidArgumentError(path + " is a public key, not a private key");
  }
  if ((file->mode & 077) != 0) {
    char mode[16];
    std::snprintf(mode, sizeof(mode), "%04o", file->mode & 07777u);
    return PermissionDeniedError("private key " + path + " is readable by others (mode " + mode +
                                 "); run: chmod 600 " + path);
  }
  auto key = ParsePrivateKeyPem(file->bytes);
  if (!key.ok()) return key.status().WithContext(path);
  return key;
}

StatusOr<PublicKey> LoadPublicKeyFile(const std::string& path) {
  auto pem = ReadFileBytes(path, 1 << 16);
  if (!pem.ok()) return pem.status().WithContext("cannot read public key");
  auto key = ParsePublicKeyPem(*pem);
  if (!key.ok()) return key.status().WithContext(path);
  return key;
}

Status SavePrivateKeyFile(const PrivateKey& key, const std::string& path) {
  CAPSULE_ASSIGN_OR_RETURN(std::string pem, key.ToPem());
  AtomicWriteOptions options;
  options.mode = 0600;
  options.overwrite = false;
  Status s = WriteFileAtomic(path, pem, options);
  OPENSSL_cleanse(pem.data(), pem.size());
  return s;
}

Status SavePublicKeyFile(const PublicKey& key, const std::string& path) {
  CAPSULE_ASSIGN_OR_RETURN(std::string pem, key.ToPem());
  AtomicWriteOptions options;
  options.mode = 0644;
  options.overwrite = false;
  return WriteFileAtomic(path, pem, options);
}

StatusOr<KeyFilePaths> KeyFilePathsFor(const std::string& prefix) {
  if (prefix.empty()) return InvalidArgumentError("no key file name (the prefix is empty)");
  const size_t slash = prefix.rfind('/');
  const std::string last = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
  if (last.empty() || last == "." || last == "..") {
    return InvalidArgumentError("key file prefix " + prefix +
                                " names a directory, not a file name (it would write hidden " +
                                "files .key and .pub); add a name, e.g. " +
                                (last.empty() ? prefix : prefix + "/") + "trainer");
  }
  return KeyFilePaths{prefix + ".key", prefix + ".pub"};
}

StatusOr<KeyFilePaths> SaveKeyPairFiles(const KeyPair& pair, const std::string& prefix) {
  CAPSULE_ASSIGN_OR_RETURN(KeyFilePaths paths, KeyFilePathsFor(prefix));
  // Checked before anything is written, so an existing .pub does not cost a freshly written .key;
  // each write below is exclusive again.
  for (const std::string* path : {&paths.private_key, &paths.public_key}) {
    struct stat st;
    if (::lstat(path->c_str(), &st) == 0) {
      return Status(StatusCode::kAlreadyExists, *path + " already exists; not overwriting it");
    }
  }
  CAPSULE_RETURN_IF_ERROR(SavePrivateKeyFile(pair.private_key, paths.private_key));
  Status s = SavePublicKeyFile(pair.public_key, paths.public_key);
  if (!s.ok()) {
    ::unlink(paths.private_key.c_str());  // ours: the exclusive write above created it
    return s;
  }
  return paths;
}

StatusOr<std::string> Sign(const PrivateKey& key, std::string_view message) {
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(key.raw().data()),
      key.raw().size()));
  if (!pkey) return InvalidArgumentError("not a usable Ed25519 private key: " + OpenSslError());
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  std::string sig(kEd25519SignatureSize, '\0');
  size_t len = sig.size();
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return InternalError("signing failed: " + OpenSslError());
  }
  sig.resize(len);
  return sig;
}

Status Verify(const PublicKey& key, std::string_view message, std::string_view signature) {
  if (signature.size() != kEd25519SignatureSize) {
    return UnauthenticatedError("bad signature (wrong length)");
  }
  PkeyPtr pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                           reinterpret_cast<const unsigned char*>(key.raw().data()),
                                           key.raw().size()));
  // OpenSSL takes any 32 bytes as a raw key: a failure here is OpenSSL's, not the key's.
  if (!pkey) return InternalError("cannot verify: " + OpenSslError());
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) != 1) {
    return InternalError("cannot verify: " + OpenSslError());
  }
  const int rc = EVP_DigestVerify(
      ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
      reinterpret_cast<const unsigned char*>(message.data()), message.size());
  // 0 is a signature that does not verify; below 0, OpenSSL could not tell.
  if (rc < 0) return InternalError("cannot verify: " + OpenSslError());
  ERR_clear_error();
  if (rc != 1) return UnauthenticatedError("bad signature");
  return Status::Ok();
}

}  // namespace capsule
