// A scratch directory for tests that touch the file system, removed with its contents when the
// test ends. Lives under ::testing::TempDir() so `ctest` runs never collide.
#ifndef CAPSULE_TESTS_FORMAT_TEMP_DIR_H_
#define CAPSULE_TESTS_FORMAT_TEMP_DIR_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace capsule::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir();
    if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
    tmpl += "capsule_test.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    }
    path_ = tmpl;
  }
  ~TempDir() {
    // Tests may leave read-only directories behind; make them removable first.
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec)) ::chmod(it->path().c_str(), 0700);
    }
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace capsule::test

#endif  // CAPSULE_TESTS_FORMAT_TEMP_DIR_H_
