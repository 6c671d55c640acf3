// Ed25519 signing keys for capsules (OpenSSL EVP underneath; PEM files interchangeable with the
// `openssl` command-line tool).
//
// A capsule is signed by the trainer's private key; a reader trusts a set of public keys and
// identifies the signer by its key id, the SHA-256 of the raw 32-byte public key. Private keys are
// PEM (PKCS#8) files with mode 0600: a private key readable by group or others is refused, as ssh
// refuses one.
//
//   CAPSULE_ASSIGN_OR_RETURN(capsule::KeyPair kp, capsule::GenerateKeyPair());
//   CAPSULE_RETURN_IF_ERROR(capsule::SavePrivateKeyFile(kp.private_key, "run.key"));
//   CAPSULE_ASSIGN_OR_RETURN(std::string sig, capsule::Sign(kp.private_key, message));
//   CAPSULE_RETURN_IF_ERROR(capsule::Verify(kp.public_key, message, sig));
//
// Thread safety: keys are immutable values; all functions are thread-safe.
#ifndef CAPSULE_FORMAT_SIGNING_H_
#define CAPSULE_FORMAT_SIGNING_H_

#include <string>
#include <string_view>

#include "capsule/base/status.h"

namespace capsule {

inline constexpr size_t kEd25519KeySize = 32;
inline constexpr size_t kEd25519SignatureSize = 64;

class PublicKey {
 public:
  // `raw` must be 32 bytes encoding a point of the curve (RFC 8032 §5.1.3) that is not of small
  // order: kInvalidArgument "not a valid Ed25519 public key: ..." otherwise. A small-order key
  // (the identity, all zeros, ...) verifies signatures anyone can make without a private key, so
  // such a key is refused wherever one is read: a --pubkey file, the key a capsule carries.
  // kInternal when its key id cannot be computed (sha256.h).
  static StatusOr<PublicKey> FromRaw(std::string_view raw);
  const std::string& raw() const { return raw_; }
  // SHA-256 of the raw key (32 bytes): how a capsule names its signer.
  const std::string& KeyId() const { return key_id_; }
  std::string KeyIdHex() const;
  // SubjectPublicKeyInfo PEM ("-----BEGIN PUBLIC KEY-----").
  StatusOr<std::string> ToPem() const;

 private:
  std::string raw_;
  std::string key_id_;  // computed once, by FromRaw
};

class PrivateKey {
 public:
  PrivateKey() = default;
  ~PrivateKey();
  PrivateKey(const PrivateKey&) = default;
  PrivateKey& operator=(const PrivateKey&) = default;
  PrivateKey(PrivateKey&&) = default;
  PrivateKey& operator=(PrivateKey&&) = default;

  // `raw` is the 32-byte seed.
  static StatusOr<PrivateKey> FromRaw(std::string_view raw);
  StatusOr<PublicKey> GetPublicKey() const;
  // PKCS#8 PEM ("-----BEGIN PRIVATE KEY-----").
  StatusOr<std::string> ToPem() const;
  const std::string& raw() const { return raw_; }

 private:
  std::string raw_;
};

struct KeyPair {
  PrivateKey private_key;
  PublicKey public_key;
};

StatusOr<KeyPair> GenerateKeyPair();

// kInvalidArgument "this is a public key, not a private key" for a public key PEM, "encrypted
// private keys are not supported" for an encrypted one (never asks for a pass phrase), "not a PEM
// private key" otherwise.
StatusOr<PrivateKey> ParsePrivateKeyPem(std::string_view pem);
StatusOr<PublicKey> ParsePublicKeyPem(std::string_view pem);

// Loads a PEM private key. kNotFound when it does not exist; kInvalidArgument when it is not a
// regular file, is a public key (said before the mode check: a .pub file is 0644), is encrypted,
// or is not an Ed25519 private key; kPermissionDenied when it is readable by group or others.
StatusOr<PrivateKey> LoadPrivateKeyFile(const std::string& path);
StatusOr<PublicKey> LoadPublicKeyFile(const std::string& path);

// Writes with mode 0600 (private) / 0644 (public), atomically and exclusively: refuses to
// overwrite an existing file (kAlreadyExists) so a key is never lost by accident.
Status SavePrivateKeyFile(const PrivateKey& key, const std::string& path);
Status SavePublicKeyFile(const PublicKey& key, const std::string& path);

// Where a key pair with file name prefix PREFIX lives: PREFIX.key (private) and PREFIX.pub.
struct KeyFilePaths {
  std::string private_key;
  std::string public_key;
};
// kInvalidArgument when PREFIX is empty or its last component is empty, "." or ".." ("dir/"
// would name the hidden files dir/.key and dir/.pub).
StatusOr<KeyFilePaths> KeyFilePathsFor(const std::string& prefix);
// Writes PREFIX.key and PREFIX.pub, exclusively. Nothing is written when either exists
// (kAlreadyExists), and the private key is removed again when the public one cannot be written:
// the pair is written whole or not at all.
StatusOr<KeyFilePaths> SaveKeyPairFiles(const KeyPair& pair, const std::string& prefix);

// Pure Ed25519 (RFC 8032) over `message`; 64-byte signature.
StatusOr<std::string> Sign(const PrivateKey& key, std::string_view message);
// OK when `signature` is a valid signature of `message` by `key`; kUnauthenticated when it is not;
// kInternal when OpenSSL cannot check it (then nothing is said about the signature).
Status Verify(const PublicKey& key, std::string_view message, std::string_view signature);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_SIGNING_H_
