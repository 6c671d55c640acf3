// torch::save and torch::load of the tensors format_bench.cc puts in its capsules (N tensors of
// 512x512 float32, the same values), in the same binary, so that ours / torch comes from one run:
//   BM_TorchSave/N          torch::save of the N tensors to memory (a growing string, as an
//                           ostringstream grows)
//   BM_TorchLoad/N          torch::load of those bytes back
//   BM_TorchSaveFile/N/0    torch::save to a new file in /tmp (no fsync: torch::save does none)
//   BM_TorchSaveFile/N/1    the same and an fsync, which BM_CapsuleWriteFile's atomic write
//                           always does
// Rates are bytes of tensor payload per second, wall time, as in format_bench.cc.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace capsule {
namespace bench {

// format_bench.cc: the tensors' data, the sizes, and what every payload bench reports.
const std::vector<float>& TensorData(int mib);
void PayloadSizes(benchmark::internal::Benchmark* b);
long MinorFaults();
void ReportPayload(benchmark::State& state, int mib, long faults_before);

}  // namespace bench

namespace {

using bench::MinorFaults;
using bench::ReportPayload;

const std::vector<torch::Tensor>& Tensors(int mib) {
  static std::map<int, std::vector<torch::Tensor>> cache;
  std::vector<torch::Tensor>& tensors = cache[mib];
  if (tensors.empty()) {
    const std::vector<float>& data = bench::TensorData(mib);
    for (int i = 0; i < mib; ++i) {
      float* first = const_cast<float*>(data.data()) + (int64_t{i} << 18);
      tensors.push_back(torch::from_blob(first, {512, 512}, torch::kFloat32).clone());
    }
  }
  return tensors;
}

std::string SaveToMemory(const std::vector<torch::Tensor>& tensors) {
  std::string out;
  torch::save(tensors, [&out](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  return out;
}

void BM_TorchSave(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const std::vector<torch::Tensor>& tensors = Tensors(mib);
  size_t out_size = 0;
  const long faults = MinorFaults();
  for (auto _ : state) {
    const std::string bytes = SaveToMemory(tensors);
    out_size = bytes.size();
    benchmark::DoNotOptimize(bytes.data());
  }
  ReportPayload(state, mib, faults);
  state.counters["ratio"] = static_cast<double>(out_size) / (int64_t{mib} << 20);
}

void BM_TorchLoad(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const std::string bytes = SaveToMemory(Tensors(mib));
  const long faults = MinorFaults();
  for (auto _ : state) {
    std::vector<torch::Tensor> loaded;
    torch::load(loaded, bytes.data(), bytes.size());
    if (loaded.size() != static_cast<size_t>(mib)) {
      state.SkipWithError("torch::load returned the wrong number of tensors");
      return;
    }
    benchmark::DoNotOptimize(loaded.data());
  }
  ReportPayload(state, mib, faults);
}

void BM_TorchSaveFile(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const bool sync = state.range(1) != 0;
  const std::vector<torch::Tensor>& tensors = Tensors(mib);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "capsule-bench-io";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "format_torch_bench.pt").string();
  const long faults = MinorFaults();
  for (auto _ : state) {
    state.PauseTiming();  // a new file each time, as BM_CapsuleWriteFile writes
    std::filesystem::remove(path);
    state.ResumeTiming();
    torch::save(tensors, path);
    if (sync) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::fsync(fd) != 0) {
        state.SkipWithError("cannot fsync the saved file");
        return;
      }
      ::close(fd);
    }
  }
  ReportPayload(state, mib, faults);
  std::filesystem::remove(path);
}

BENCHMARK(BM_TorchSave)->Apply(bench::PayloadSizes);
BENCHMARK(BM_TorchLoad)->Apply(bench::PayloadSizes);
BENCHMARK(BM_TorchSaveFile)
    ->ArgsProduct({{1, 16, 64, 256}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace capsule
