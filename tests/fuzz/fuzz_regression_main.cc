// Regression driver for a fuzz target: feeds every file of a corpus directory to
// LLVMFuzzerTestOneInput, as libFuzzer would, in a normal (non-fuzzer) build, so crashes once
// found stay fixed under plain ctest. Built once per target (tests/fuzz/CMakeLists.txt).
//
// Built for the DecodeCapsule target (CAPSULE_FUZZ_EXPECTATIONS) or the checkpoint reader's
// (CAPSULE_FUZZ_CHECKPOINT_EXPECTATIONS), it also checks the expectation seed names carry, so
// seeds cannot rot silently into inputs that stop at the first check: "ok-*" must be read, "bad-*"
// must be rejected (see capsule::fuzz::DecodeForRegression, CheckpointForRegression). Other files
// (crash reproducers) only must not crash.
//
//   capsule_fuzz_regression tests/fuzz/corpus
//   capsule_fuzz_regression_checkpoint tests/fuzz/corpus/checkpoint
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#if defined(CAPSULE_FUZZ_EXPECTATIONS)
#include "tests/fuzz/decode_capsule_fuzzer.h"
#define CAPSULE_FUZZ_VERDICT capsule::fuzz::DecodeForRegression
#elif defined(CAPSULE_FUZZ_CHECKPOINT_EXPECTATIONS)
#include "tests/fuzz/checkpoint_fuzzer.h"
#define CAPSULE_FUZZ_VERDICT capsule::fuzz::CheckpointForRegression
#else
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
#endif

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(argv[1], ec)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  if (ec) {
    std::fprintf(stderr, "cannot list %s: %s\n", argv[1], ec.message().c_str());
    return 2;
  }
  // An empty or mistyped directory must not pass as "no crashes".
  if (files.empty()) {
    std::fprintf(stderr, "no corpus files in %s\n", argv[1]);
    return 2;
  }
  std::sort(files.begin(), files.end());

  int failures = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 2;
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());

    const std::string name = path.filename().string();
#ifdef CAPSULE_FUZZ_VERDICT
    const capsule::Status s = CAPSULE_FUZZ_VERDICT(bytes);
    const bool want_ok = name.rfind("ok-", 0) == 0;
    const bool want_bad = name.rfind("bad-", 0) == 0;
    const bool wrong = (want_ok && !s.ok()) || (want_bad && s.ok());
    std::printf("%-4s %-40s %s\n", wrong ? "FAIL" : "ok", name.c_str(), s.ToString().c_str());
    if (wrong) ++failures;
#else
    std::printf("ok   %s\n", name.c_str());
#endif
  }
  std::printf("%zu files, %d unexpected results\n", files.size(), failures);
  return failures == 0 ? 0 : 1;
}
