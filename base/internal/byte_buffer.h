// Large scratch buffers that fill at memory speed. Writing fresh memory costs a page fault per
// 4 KiB page, and under some hypervisors a fault costs 15-20 us: a fresh 50 MB buffer then fills
// at about 200 MB/s, slower than it is compressed or hashed. AdviseHugePages asks for 2 MiB pages
// (512 times fewer faults); ByteBuffer also keeps its memory across uses, so only the first fill
// of a given size pays at all.
//
//   capsule::ByteBuffer buffer;
//   char* out = buffer.Reserve(bytes.size());   // contents undefined; kept for the next use
//   std::memcpy(out, bytes.data(), bytes.size());
//
// Thread safety: a ByteBuffer is a plain value; AdviseHugePages is thread-safe.
#ifndef CAPSULE_BASE_INTERNAL_BYTE_BUFFER_H_
#define CAPSULE_BASE_INTERNAL_BYTE_BUFFER_H_

#include <cstddef>
#include <memory>

namespace capsule {

// Hints that the whole 2 MiB pages inside [data, data + size) be backed by huge pages when first
// written. Only a hint: without transparent huge pages (or off Linux) nothing changes.
void AdviseHugePages(char* data, size_t size);

class ByteBuffer {
 public:
  // Room for at least `size` bytes. Grows (losing the contents) when it has less, and never
  // shrinks.
  char* Reserve(size_t size);
  char* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
};

}  // namespace capsule

#endif  // CAPSULE_BASE_INTERNAL_BYTE_BUFFER_H_
