# capsule_add_model_plugin(TARGET SOURCE...): a shared module that `capsule replay --plugin` loads.
#
# Its sources define capsule_register_models (capsule/replay/plugin_loader.h). The module shares
# the host's LibTorch (shared libraries) and carries private static copies of the capsule code it
# needs: hidden visibility and --exclude-libs keep every symbol but the entry point local, so it
# neither clashes with nor binds to the host's copies, and --no-undefined makes a missing symbol a
# link error rather than a dlopen failure. Link the model's own library to TARGET as usual.
#
#   find_package(capsule REQUIRED)
#   capsule_add_model_plugin(my_models_plugin plugin.cc)
#   target_link_libraries(my_models_plugin PRIVATE my_models)
function(capsule_add_model_plugin target)
  add_library(${target} MODULE ${ARGN})
  target_link_libraries(${target} PRIVATE capsule::replay)
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${target} PRIVATE LINKER:--exclude-libs,ALL)
  if(NOT CAPSULE_SANITIZE)
    # (Sanitizer runtimes live in the host executable, so sanitized builds skip the check.)
    target_link_options(${target} PRIVATE LINKER:--no-undefined)
  endif()
endfunction()
