// capsule_make_golden: rebuilds samples/golden deterministically.
//
//   capsule_make_golden KEY_DIR OUT_DIR
// reads KEY_DIR/test-only.key and KEY_DIR/test-only-other.key (TEST-ONLY keys) and writes
// OUT_DIR/valid/*.capsule, OUT_DIR/invalid/*.capsule and OUT_DIR/EXPECTED.
#include <sys/stat.h>

#include <iostream>

#include "capsule/base/internal/file_util.h"
#include "samples/golden/golden_capsules.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: capsule_make_golden KEY_DIR OUT_DIR\n";
    return 2;
  }
  const std::string keys = argv[1];
  const std::string out = argv[2];
  auto key = capsule::golden::LoadTestOnlyKey(keys + "/test-only.key");
  auto other = capsule::golden::LoadTestOnlyKey(keys + "/test-only-other.key");
  if (!key.ok() || !other.ok()) {
    std::cerr << "capsule_make_golden: " << (key.ok() ? other.status() : key.status()) << "\n";
    return 2;
  }
  auto files = capsule::golden::MakeGoldenFiles(*key, *other);
  if (!files.ok()) {
    std::cerr << "capsule_make_golden: " << files.status() << "\n";
    return 2;
  }
  ::mkdir(out.c_str(), 0755);
  ::mkdir((out + "/valid").c_str(), 0755);
  ::mkdir((out + "/invalid").c_str(), 0755);
  std::string expected =
      "# file  status code of DecodeCapsule with the default ReadOptions trusting "
      "samples/keys/test-only.pub\n";
  // Regenerating in place (samples/golden) replaces the previous files.
  capsule::AtomicWriteOptions replace;
  replace.overwrite = true;
  for (const auto& f : *files) {
    capsule::Status s = capsule::WriteFileAtomic(out + "/" + f.name, f.bytes, replace);
    if (!s.ok()) {
      std::cerr << "capsule_make_golden: " << s << "\n";
      return 2;
    }
    expected += f.name + " " + std::string(capsule::StatusCodeName(f.expected)) + "\n";
  }
  capsule::Status s = capsule::WriteFileAtomic(out + "/EXPECTED", expected, replace);
  if (!s.ok()) {
    std::cerr << "capsule_make_golden: " << s << "\n";
    return 2;
  }
  std::cout << "wrote " << files->size() << " golden files to " << out << "\n";
  return 0;
}
