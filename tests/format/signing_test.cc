// Ed25519 keys (proto/signing.h) and SHA-256 helpers (proto/sha256.h).
#include "capsule/format/signing.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "capsule/base/internal/file_util.h"
#include "capsule/base/internal/sha256.h"
#include "tests/format/capsule_test_util.h"
#include "tests/format/temp_dir.h"

namespace capsule::test {
namespace {

std::string Unhex(std::string_view hex) { return HexDecode(hex).value(); }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::binary) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// ---- SHA-256 ----------------------------------------------------------------------------------

TEST(Sha256Test, KnownAnswers) {
  EXPECT_EQ(*Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(*Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(*Sha256("abc"),
            Unhex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  EXPECT_EQ(Sha256("abc")->size(), kSha256Size);
}

TEST(Sha256Test, IncrementalMatchesOneShotAndResets) {
  const std::string data(100000, 'q');
  Sha256Hasher h;
  h.Update(std::string_view(data).substr(0, 333));
  h.Update(data.data() + 333, data.size() - 333);
  EXPECT_EQ(*h.Finish(), *Sha256(data));
  h.Update("abc");
  EXPECT_EQ(*h.Finish(), *Sha256("abc"));
  EXPECT_EQ(*h.Finish(), *Sha256(""));
}

TEST(Sha256Test, Hex) {
  EXPECT_EQ(HexEncode(std::string("\x00\x01\xab\xff", 4)), "0001abff");
  EXPECT_EQ(HexDecode("0001abff"), std::string("\x00\x01\xab\xff", 4));
  EXPECT_EQ(HexDecode("0001ABFF"), std::string("\x00\x01\xab\xff", 4));
  EXPECT_EQ(HexDecode(""), std::string());
  EXPECT_FALSE(HexDecode("abc").has_value());
  EXPECT_FALSE(HexDecode("zz").has_value());
  EXPECT_FALSE(HexDecode("0g").has_value());
}

TEST(Sha256Test, IsSha256Hex) {
  const std::string good = *Sha256Hex("x");
  EXPECT_TRUE(IsSha256Hex(good));
  EXPECT_FALSE(IsSha256Hex(good.substr(1)));
  EXPECT_FALSE(IsSha256Hex(good + "0"));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'A')));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'g')));
  EXPECT_FALSE(IsSha256Hex(""));
}

// ---- Keys -------------------------------------------------------------------------------------

// RFC 8032 §7.1, TEST 1 (empty message).
constexpr char kRfcSecret[] = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
constexpr char kRfcPublic[] = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
constexpr char kRfcSignature[] =
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b4"
    "6bd25bf5f0595bbe24655141438e7a100b";

TEST(KeysTest, Rfc8032Vector) {
  StatusOr<PrivateKey> key = PrivateKey::FromRaw(Unhex(kRfcSecret));
  ASSERT_TRUE(key.ok()) << key.status();
  StatusOr<PublicKey> pub = key->GetPublicKey();
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(HexEncode(pub->raw()), kRfcPublic);
  StatusOr<std::string> sig = Sign(*key, "");
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_EQ(HexEncode(*sig), kRfcSignature);
  EXPECT_TRUE(Verify(*pub, "", *sig).ok());
}

TEST(KeysTest, GenerateGivesDistinctUsableKeys) {
  StatusOr<KeyPair> a = GenerateKeyPair();
  StatusOr<KeyPair> b = GenerateKeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->private_key.raw().size(), kEd25519KeySize);
  EXPECT_EQ(a->public_key.raw().size(), kEd25519KeySize);
  EXPECT_NE(a->private_key.raw(), b->private_key.raw());
  EXPECT_NE(a->public_key.raw(), b->public_key.raw());
  EXPECT_EQ(a->private_key.GetPublicKey()->raw(), a->public_key.raw());
}

TEST(KeysTest, KeyIdIsSha256OfTheRawPublicKey) {
  const PublicKey pub = OrDie(PublicKey::FromRaw(Unhex(kRfcPublic)));
  EXPECT_EQ(pub.KeyId(), *Sha256(Unhex(kRfcPublic)));
  EXPECT_EQ(pub.KeyId().size(), 32u);
  EXPECT_EQ(pub.KeyIdHex(), *Sha256Hex(Unhex(kRfcPublic)));
}

TEST(KeysTest, RawSizesAreChecked) {
  EXPECT_TRUE(HasError(PublicKey::FromRaw(std::string(31, 'x')), StatusCode::kInvalidArgument,
                       "an Ed25519 public key is 32 bytes, got 31"));
  EXPECT_TRUE(HasError(PrivateKey::FromRaw(std::string(33, 'x')), StatusCode::kInvalidArgument,
                       "an Ed25519 private key is 32 bytes, got 33"));
  EXPECT_TRUE(HasError(PrivateKey().GetPublicKey(), StatusCode::kInvalidArgument,
                       "not a usable Ed25519 private key"));
}

TEST(KeysTest, PemRoundTrip) {
  const KeyPair kp = OrDie(GenerateKeyPair());
  StatusOr<std::string> priv_pem = kp.private_key.ToPem();
  StatusOr<std::string> pub_pem = kp.public_key.ToPem();
  ASSERT_TRUE(priv_pem.ok() && pub_pem.ok());
  EXPECT_EQ(priv_pem->rfind("-----BEGIN PRIVATE KEY-----", 0), 0u) << *priv_pem;
  EXPECT_EQ(pub_pem->rfind("-----BEGIN PUBLIC KEY-----", 0), 0u) << *pub_pem;
  StatusOr<PrivateKey> priv = ParsePrivateKeyPem(*priv_pem);
  StatusOr<PublicKey> pub = ParsePublicKeyPem(*pub_pem);
  ASSERT_TRUE(priv.ok()) << priv.status();
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(priv->raw(), kp.private_key.raw());
  EXPECT_EQ(pub->raw(), kp.public_key.raw());
}

TEST(KeysTest, PublicPemIsNotAPrivateKey) {
  const KeyPair kp = OrDie(GenerateKeyPair());
  EXPECT_TRUE(HasError(ParsePrivateKeyPem(OrDie(kp.public_key.ToPem())),
                       StatusCode::kInvalidArgument, "public key, not a private key"));
  EXPECT_TRUE(HasError(ParsePublicKeyPem(OrDie(kp.private_key.ToPem())),
                       StatusCode::kInvalidArgument, "not a PEM public key"));
  EXPECT_TRUE(HasError(ParsePrivateKeyPem("garbage"), StatusCode::kInvalidArgument,
                       "not a PEM private key"));
  EXPECT_TRUE(HasError(ParsePublicKeyPem(""), StatusCode::kInvalidArgument, "not a PEM"));
}

TEST(KeysTest, OtherKeyTypesAreRefused) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> x25519(
      EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519"), EVP_PKEY_free);
  ASSERT_NE(x25519, nullptr);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  ASSERT_EQ(
      PEM_write_bio_PrivateKey(bio.get(), x25519.get(), nullptr, nullptr, 0, nullptr, nullptr), 1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  EXPECT_TRUE(HasError(ParsePrivateKeyPem(std::string(data, n)), StatusCode::kInvalidArgument,
                       "not an Ed25519 key"));
}

// A raw key from its y coordinate (little-endian hex) with the sign bit of x set or not.
std::string KeyOfY(std::string_view y_hex, bool x_negative) {
  std::string raw = Unhex(y_hex);
  raw.resize(kEd25519KeySize, '\0');
  if (x_negative) raw[31] = static_cast<char>(raw[31] | 0x80);
  return raw;
}

TEST(KeysTest, SmallOrderPublicKeysAreRefused) {
  // The eight points of order 1, 2, 4 and 8 (libsodium's blocklist): y = 1, p-1, 0, and the two
  // order-8 ones, each with either sign of x.
  for (const char* y : {"01", "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
                        "00", "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
                        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"}) {
    for (bool negative : {false, true}) {
      EXPECT_TRUE(HasError(PublicKey::FromRaw(KeyOfY(y, negative)), StatusCode::kInvalidArgument,
                           "not a valid Ed25519 public key: a point of small order"))
          << y << (negative ? " -x" : " +x");
    }
  }
}

TEST(KeysTest, KeysOffTheCurveOrNotCanonicalAreRefused) {
  // y = p, p + 1 and 2^255 - 1 are not below p (p and p + 1 name the points 0 and 1 again).
  for (const char* y : {"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
                        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
                        "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"}) {
    EXPECT_TRUE(HasError(PublicKey::FromRaw(KeyOfY(y, false)), StatusCode::kInvalidArgument,
                         "non-canonical"))
        << y;
  }
  // (y^2 - 1) / (d y^2 + 1) has no square root for y = 2 and y = 7; it has for y = 3.
  for (const char* y : {"02", "07"}) {
    EXPECT_TRUE(HasError(PublicKey::FromRaw(KeyOfY(y, false)), StatusCode::kInvalidArgument,
                         "not a point of the curve"))
        << y;
  }
  EXPECT_TRUE(PublicKey::FromRaw(KeyOfY("03", false)).ok());
}

TEST(KeysTest, RealKeysAreValidPoints) {
  EXPECT_TRUE(PublicKey::FromRaw(Unhex(kRfcPublic)).ok());
  for (int i = 0; i < 64; ++i) {
    const KeyPair kp = OrDie(GenerateKeyPair());
    EXPECT_TRUE(PublicKey::FromRaw(kp.public_key.raw()).ok()) << kp.public_key.KeyIdHex();
  }
}

TEST(KeysTest, SmallOrderPemIsRefused) {
  // SubjectPublicKeyInfo of Ed25519 (RFC 8410) around the identity point: OpenSSL parses it.
  const std::string der = Unhex("302a300506032b6570032100") + KeyOfY("01", false);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(der.data(), der.size()), BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(d2i_PUBKEY_bio(bio.get(), nullptr),
                                                           EVP_PKEY_free);
  ASSERT_NE(pkey, nullptr);
  std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), BIO_free);
  ASSERT_EQ(PEM_write_bio_PUBKEY(out.get(), pkey.get()), 1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  EXPECT_TRUE(HasError(ParsePublicKeyPem(std::string(data, n)), StatusCode::kInvalidArgument,
                       "a point of small order"));
}

TEST(KeysTest, SignAndVerify) {
  const PrivateKey key = FixedKey('\x11');
  const PublicKey pub = OrDie(key.GetPublicKey());
  const PublicKey other = OrDie(FixedKey('\x22').GetPublicKey());
  const std::string sig = OrDie(Sign(key, "message"));
  EXPECT_EQ(sig.size(), kEd25519SignatureSize);
  EXPECT_EQ(OrDie(Sign(key, "message")), sig) << "Ed25519 is deterministic";
  EXPECT_TRUE(Verify(pub, "message", sig).ok());
  EXPECT_TRUE(HasError(Verify(pub, "messagE", sig), StatusCode::kUnauthenticated, "bad signature"));
  EXPECT_TRUE(
      HasError(Verify(other, "message", sig), StatusCode::kUnauthenticated, "bad signature"));
  std::string flipped = sig;
  flipped[10] ^= 0x01;
  EXPECT_TRUE(
      HasError(Verify(pub, "message", flipped), StatusCode::kUnauthenticated, "bad signature"));
  EXPECT_TRUE(HasError(Verify(pub, "message", sig.substr(1)), StatusCode::kUnauthenticated,
                       "bad signature (wrong length)"));
  EXPECT_TRUE(HasError(Verify(pub, "message", ""), StatusCode::kUnauthenticated, "wrong length"));
}

// Run by the sha256_fail_closed test (tests/format/CMakeLists.txt) in a process whose
// OPENSSL_CONF loads no provider with SHA-256; skipped otherwise. A digest OpenSSL could not
// compute used to come back as 32 zero bytes, so an unsigned capsule whose trailer held a zero
// digest read as intact and every good capsule read as corrupt.
class Sha256FailClosedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("CAPSULE_TEST_OPENSSL_WITHOUT_SHA256") == nullptr) {
      GTEST_SKIP() << "runs under tests/format/openssl_without_sha256.cnf (ctest "
                      "sha256_fail_closed)";
    }
  }
  // Golden samples: nothing can be encoded in this process.
  static std::string Golden(const std::string& name) {
    return OrDie(
        ReadFileBytes(std::string(CAPSULE_SOURCE_DIR) + "/samples/golden/valid/" + name, 1 << 20));
  }
};

TEST_F(Sha256FailClosedTest, HashingIsAnErrorNotADigest) {
  EXPECT_TRUE(HasError(Sha256("abc"), StatusCode::kInternal, "cannot compute SHA-256"));
  EXPECT_TRUE(HasError(Sha256Hex("abc"), StatusCode::kInternal, "OPENSSL_CONF"));
  Sha256Hasher h;
  h.Update("abc");
  EXPECT_TRUE(HasError(h.Finish(), StatusCode::kInternal, "cannot compute SHA-256"));
  EXPECT_TRUE(HasError(PublicKey::FromRaw(Unhex(kRfcPublic)), StatusCode::kInternal,
                       "cannot compute SHA-256"));
}

TEST_F(Sha256FailClosedTest, ReadingAndWritingAreErrorsNotVerdicts) {
  ReadOptions o;
  o.allow_unsigned = true;
  o.allow_untrusted = true;
  const std::string unsigned_capsule = Golden("unsigned.capsule");
  EXPECT_TRUE(HasError(DecodeCapsule(unsigned_capsule, o), StatusCode::kInternal,
                       "cannot compute SHA-256"));
  // The zero digest a failed hash used to compute.
  std::string zero = unsigned_capsule;
  zero.replace(ParseLayout(zero).digest_at(), kSha256Size, std::string(kSha256Size, '\0'));
  EXPECT_TRUE(HasError(DecodeCapsule(zero, o), StatusCode::kInternal, "cannot compute SHA-256"));
  EXPECT_TRUE(HasError(DecodeCapsule(Golden("full.capsule"), o), StatusCode::kInternal,
                       "cannot compute SHA-256"));
  EXPECT_TRUE(HasError(EncodeCapsule(MakeMinimalCapsule(), WriteOptions()), StatusCode::kInternal,
                       "cannot compute SHA-256"));
}

// ---- Key files --------------------------------------------------------------------------------

class KeyFileTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(KeyFileTest, SavePrivateKeyFileIsMode0600AndLoads) {
  const KeyPair kp = OrDie(GenerateKeyPair());
  const std::string path = dir_.path() + "/run.key";
  // A permissive umask must not leak into the key's mode.
  const mode_t old_umask = ::umask(0);
  const Status saved = SavePrivateKeyFile(kp.private_key, path);
  ::umask(old_umask);
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(ModeOf(path), 0600u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path()),
                          std::filesystem::directory_iterator()),
            1);  // the key and nothing else: no temporary file left behind
  StatusOr<PrivateKey> loaded = LoadPrivateKeyFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->raw(), kp.private_key.raw());
}

TEST_F(KeyFileTest, SavePrivateKeyFileRefusesToOverwrite) {
  const std::string path = dir_.path() + "/run.key";
  const KeyPair first = OrDie(GenerateKeyPair());
  const KeyPair second = OrDie(GenerateKeyPair());
  ASSERT_TRUE(SavePrivateKeyFile(first.private_key, path).ok());
  const std::string before = ReadAll(path);
  EXPECT_TRUE(HasError(SavePrivateKeyFile(second.private_key, path), StatusCode::kAlreadyExists,
                       "already exists; not overwriting it"));
  EXPECT_EQ(ReadAll(path), before);
  EXPECT_EQ(OrDie(LoadPrivateKeyFile(path)).raw(), first.private_key.raw());
}

TEST_F(KeyFileTest, SavePublicKeyFileIsMode0644AndLoads) {
  const KeyPair kp = OrDie(GenerateKeyPair());
  const std::string path = dir_.path() + "/run.pub";
  ASSERT_TRUE(SavePublicKeyFile(kp.public_key, path).ok());
  EXPECT_EQ(ModeOf(path), 0644u);
  StatusOr<PublicKey> loaded = LoadPublicKeyFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->raw(), kp.public_key.raw());
  EXPECT_TRUE(HasError(SavePublicKeyFile(kp.public_key, path), StatusCode::kAlreadyExists,
                       "already exists"));
}

TEST_F(KeyFileTest, GroupOrWorldReadablePrivateKeyIsRefused) {
  const KeyPair kp = OrDie(GenerateKeyPair());
  const std::string path = dir_.path() + "/loose.key";
  for (mode_t mode : {0644, 0640, 0604, 0660, 0601}) {
    ::unlink(path.c_str());
    WriteAll(path, OrDie(kp.private_key.ToPem()), mode);
    char expected[64];
    std::snprintf(expected, sizeof(expected), "(mode %04o); run: chmod 600 ",
                  static_cast<unsigned>(mode));
    EXPECT_TRUE(HasError(LoadPrivateKeyFile(path), StatusCode::kPermissionDenied,
                         std::string("is readable by others ") + expected + path));
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(LoadPrivateKeyFile(path).ok());
}

TEST_F(KeyFileTest, MissingKeyFiles) {
  EXPECT_TRUE(HasError(LoadPrivateKeyFile(dir_.path() + "/none.key"), StatusCode::kNotFound,
                       "cannot read private key"));
  EXPECT_TRUE(HasError(LoadPublicKeyFile(dir_.path() + "/none.pub"), StatusCode::kNotFound,
                       "cannot read public key"));
}

TEST_F(KeyFileTest, PublicKeyFileLoadedAsPrivateSaysItIsAPublicKey) {
  // As written by keygen (0644), and with a private key's mode: the answer is the same, not
  // "readable by others (mode 0644)" nor "not a PEM private key".
  const KeyPair kp = OrDie(GenerateKeyPair());
  for (mode_t mode : {0644, 0600}) {
    const std::string path = dir_.path() + "/swapped" + std::to_string(mode) + ".pub";
    WriteAll(path, OrDie(kp.public_key.ToPem()), mode);
    EXPECT_TRUE(HasError(LoadPrivateKeyFile(path), StatusCode::kInvalidArgument,
                         path + " is a public key, not a private key"));
  }
  EXPECT_TRUE(HasError(ParsePrivateKeyPem(OrDie(kp.public_key.ToPem())),
                       StatusCode::kInvalidArgument, "this is a public key, not a private key"));
}

TEST_F(KeyFileTest, EncryptedPrivateKeyIsRefusedWithoutAPrompt) {
  // OpenSSL's default callback would ask "Enter PEM pass phrase:" on the terminal.
  const KeyPair kp = OrDie(GenerateKeyPair());
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      EVP_PKEY_new_raw_private_key(
          EVP_PKEY_ED25519, nullptr,
          reinterpret_cast<const unsigned char*>(kp.private_key.raw().data()), 32),
      EVP_PKEY_free);
  ASSERT_TRUE(pkey);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  char pass[] = "secret";
  ASSERT_EQ(PEM_write_bio_PKCS8PrivateKey(bio.get(), pkey.get(), EVP_aes_256_cbc(), pass, 6,
                                          nullptr, nullptr),
            1);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  const std::string pem(data, static_cast<size_t>(n));
  ASSERT_NE(pem.find("ENCRYPTED PRIVATE KEY"), std::string::npos);
  const std::string path = dir_.path() + "/encrypted.key";
  WriteAll(path, pem, 0600);
  EXPECT_TRUE(HasError(LoadPrivateKeyFile(path), StatusCode::kInvalidArgument,
                       path + ": encrypted private keys are not supported"));
}

TEST_F(KeyFileTest, PrivateKeyThatIsNotARegularFile) {
  EXPECT_TRUE(HasError(LoadPrivateKeyFile(dir_.path()), StatusCode::kInvalidArgument,
                       "is not a regular file (a directory)"));
}

TEST_F(KeyFileTest, KeyPairFilesAreWrittenWholeAndExclusively) {
  const KeyPair kp = OrDie(GenerateKeyPair());
  const std::string prefix = dir_.path() + "/run";
  StatusOr<KeyFilePaths> paths = SaveKeyPairFiles(kp, prefix);
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_EQ(paths->private_key, prefix + ".key");
  EXPECT_EQ(paths->public_key, prefix + ".pub");
  EXPECT_EQ(ModeOf(prefix + ".key"), 0600u);
  EXPECT_EQ(ModeOf(prefix + ".pub"), 0644u);
  EXPECT_EQ(OrDie(LoadPrivateKeyFile(prefix + ".key")).raw(), kp.private_key.raw());
  EXPECT_EQ(OrDie(LoadPublicKeyFile(prefix + ".pub")).raw(), kp.public_key.raw());

  // A second pair under the same prefix replaces nothing.
  const KeyPair other = OrDie(GenerateKeyPair());
  EXPECT_TRUE(HasError(SaveKeyPairFiles(other, prefix), StatusCode::kAlreadyExists,
                       prefix + ".key already exists; not overwriting it"));
  EXPECT_EQ(OrDie(LoadPrivateKeyFile(prefix + ".key")).raw(), kp.private_key.raw());

  // Only the .pub exists: no lone .key is left behind.
  const std::string lone = dir_.path() + "/lone";
  WriteAll(lone + ".pub", "someone else's", 0644);
  EXPECT_TRUE(HasError(SaveKeyPairFiles(other, lone), StatusCode::kAlreadyExists,
                       lone + ".pub already exists"));
  EXPECT_EQ(::access((lone + ".key").c_str(), F_OK), -1);
  EXPECT_EQ(ReadAll(lone + ".pub"), "someone else's");
}

TEST_F(KeyFileTest, KeyPairPrefixMustNameAFile) {
  // "" and "dir/" used to write the hidden files ".key"/".pub" and "dir/.key"/"dir/.pub".
  const KeyPair kp = OrDie(GenerateKeyPair());
  EXPECT_TRUE(HasError(SaveKeyPairFiles(kp, ""), StatusCode::kInvalidArgument,
                       "no key file name (the prefix is empty)"));
  for (const std::string& prefix : {dir_.path() + "/", dir_.path() + "/.", dir_.path() + "/..",
                                    std::string("."), std::string("/")}) {
    EXPECT_TRUE(HasError(SaveKeyPairFiles(kp, prefix), StatusCode::kInvalidArgument,
                         "names a directory, not a file name"))
        << prefix;
  }
  EXPECT_TRUE(HasError(KeyFilePathsFor(dir_.path() + "/"), StatusCode::kInvalidArgument,
                       "add a name, e.g. " + dir_.path() + "/trainer"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_.path()),
                          std::filesystem::directory_iterator()),
            0);
}

TEST_F(KeyFileTest, KeysFromTheOpensslToolLoad) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no openssl command-line tool";
  }
  const std::string key = dir_.path() + "/tool.key";
  const std::string pub = dir_.path() + "/tool.pub";
  const std::string cmd = "openssl genpkey -algorithm ed25519 -out '" + key +
                          "' 2>/dev/null && openssl pkey -in '" + key + "' -pubout -out '" + pub +
                          "' 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  StatusOr<PrivateKey> priv = LoadPrivateKeyFile(key);
  ASSERT_TRUE(priv.ok()) << priv.status();
  StatusOr<PublicKey> pubkey = LoadPublicKeyFile(pub);
  ASSERT_TRUE(pubkey.ok()) << pubkey.status();
  EXPECT_EQ(OrDie(priv->GetPublicKey()).raw(), pubkey->raw());

  // And the other way: what we sign, the tool verifies.
  const std::string msg = dir_.path() + "/msg";
  const std::string sig = dir_.path() + "/msg.sig";
  std::ofstream(msg, std::ios::binary) << "capsule";
  std::ofstream(sig, std::ios::binary) << OrDie(Sign(*priv, "capsule"));
  const std::string verify = "openssl pkeyutl -verify -pubin -inkey '" + pub + "' -rawin -in '" +
                             msg + "' -sigfile '" + sig + "' >/dev/null 2>&1";
  EXPECT_EQ(std::system(verify.c_str()), 0) << verify;
}

}  // namespace
}  // namespace capsule::test
