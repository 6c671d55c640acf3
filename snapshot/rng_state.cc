#include "capsule/snapshot/rng_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>

#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

std::string StateBytes(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor state = gen.get_state();
  return std::string(reinterpret_cast<const char*>(state.data_ptr()),
                     static_cast<size_t>(state.numel()));
}

Status SetStateBytes(at::Generator gen, const std::string& bytes, const std::string& name) {
  try {
    at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
    return Status::Ok();
  } catch (const c10::Error& e) {
    return InvalidArgumentError("cannot restore RNG " + name + ": " + e.what_without_backtrace());
  }
}

int NumCudaDevices() {
  try {
    return at::hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0;
  } catch (const c10::Error&) {
    return 0;
  }
}

}  // namespace

std::vector<RngBlobData> SnapshotTorchRngs() {
  std::vector<RngBlobData> out;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  out.push_back({"torch.cpu", v1::TORCH_CPU_GENERATOR, "cpu", StateBytes(cpu), cpu.current_seed()});
  const int gpus = NumCudaDevices();
  for (int i = 0; i < gpus; ++i) {
    try {
      at::Generator gen = at::detail::getCUDAHooks().getDefaultCUDAGenerator(i);
      const std::string device = "cuda:" + std::to_string(i);
      out.push_back({"torch." + device, v1::TORCH_CUDA_GENERATOR, device, StateBytes(gen),
                     gen.current_seed()});
    } catch (const c10::Error&) {
      // A device that cannot report its generator is left out rather than failing the snapshot.
    }
  }
  return out;
}

Status RestoreTorchRngs(const std::vector<RngBlobData>& blobs) {
  for (const RngBlobData& b : blobs) {
    if (b.kind == v1::TORCH_CPU_GENERATOR) {
      CAPSULE_RETURN_IF_ERROR(SetStateBytes(at::detail::getDefaultCPUGenerator(), b.state, b.name));
    } else if (b.kind == v1::TORCH_CUDA_GENERATOR) {
      const int index = b.device.rfind("cuda:", 0) == 0 ? std::atoi(b.device.c_str() + 5) : -1;
      if (index < 0 || index >= NumCudaDevices()) {
        return FailedPreconditionError("capsule has RNG state for " + b.device +
                                       " but this host has no such device");
      }
      CAPSULE_RETURN_IF_ERROR(SetStateBytes(
          at::detail::getCUDAHooks().getDefaultCUDAGenerator(index), b.state, b.name));
    }
  }
  return Status::Ok();
}

}  // namespace capsule
