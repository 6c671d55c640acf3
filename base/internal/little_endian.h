// Little-endian loads and stores: the capsule envelope's integer fields (proto/FORMAT.md §2: every
// integer is little-endian) and the zip records of checkpoints. Not installed: the envelope code,
// the checkpoint reader and the byte-surgery tests use them.
#ifndef CAPSULE_BASE_INTERNAL_LITTLE_ENDIAN_H_
#define CAPSULE_BASE_INTERNAL_LITTLE_ENDIAN_H_

#include <cstdint>

namespace capsule::internal {

inline uint16_t LoadLe16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | u[1] << 8);
}
inline uint32_t LoadLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | static_cast<uint32_t>(u[1]) << 8 |
         static_cast<uint32_t>(u[2]) << 16 | static_cast<uint32_t>(u[3]) << 24;
}
inline uint64_t LoadLe64(const char* p) {
  return static_cast<uint64_t>(LoadLe32(p)) | static_cast<uint64_t>(LoadLe32(p + 4)) << 32;
}
inline void StoreLe16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v);
  p[1] = static_cast<char>(v >> 8);
}
inline void StoreLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void StoreLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

}  // namespace capsule::internal

#endif  // CAPSULE_BASE_INTERNAL_LITTLE_ENDIAN_H_
