// The one translation unit of capsule_torch_pch (cmake/capsuleTorchPch.cmake): CMake compiles the
// precompiled header for it, and the LibTorch targets reuse that header.
