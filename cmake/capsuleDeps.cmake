# Dependencies found without pkg-config, shared by capsule's build and its installed package
# config, so that a project using the package needs neither pkg-config nor anything capsule's own
# build needed for its tools (CLI11 is looked up only for capsule::cli).
#   CapsuleDeps::zstd   libzstd (headers and library)
if(NOT TARGET CapsuleDeps::zstd)
  find_path(CAPSULE_ZSTD_INCLUDE_DIR zstd.h)
  find_library(CAPSULE_ZSTD_LIBRARY NAMES zstd)
  if(NOT CAPSULE_ZSTD_INCLUDE_DIR OR NOT CAPSULE_ZSTD_LIBRARY)
    message(FATAL_ERROR "capsule needs libzstd (Debian: libzstd-dev)")
  endif()
  add_library(CapsuleDeps::zstd UNKNOWN IMPORTED)
  set_target_properties(CapsuleDeps::zstd PROPERTIES
    IMPORTED_LOCATION "${CAPSULE_ZSTD_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAPSULE_ZSTD_INCLUDE_DIR}")
endif()
