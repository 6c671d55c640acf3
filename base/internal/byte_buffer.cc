#include "capsule/base/internal/byte_buffer.h"

#include <sys/mman.h>

#include <cstdint>

namespace capsule {

void AdviseHugePages(char* data, size_t size) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)size;
#endif
}

char* ByteBuffer::Reserve(size_t size) {
  if (size > capacity_ || !data_) {
    data_.reset();  // the old memory goes back before the new is taken
    // Uninitialised: zero-filling would touch every page before the caller's own write does.
    data_.reset(new char[size == 0 ? 1 : size]);
    capacity_ = size;
    AdviseHugePages(data_.get(), capacity_);
  }
  return data_.get();
}

}  // namespace capsule
