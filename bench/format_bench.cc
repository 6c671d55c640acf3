// Capsule codec throughput, in bytes of tensor payload per second (wall time), for capsules
// carrying N MiB of float32 tensors (N tensors of 512x512), N = 1, 16, 64, 256:
//   BM_CapsuleEncode/N         EncodeCapsule: serialize + zstd + digest + Ed25519, validation off
//                              (the codec alone)
//   BM_CapsuleEncodeChecked/N  EncodeCapsule with WriteOptions' defaults, as capture writes:
//                              ValidateCapsule first, every tensor's SHA-256 recomputed
//   BM_CapsuleWriteFile/N      WriteCapsuleFile of a new file in /tmp, validation off: encoded
//                              straight into the atomic write (temporary file, fsync, rename,
//                              fsync of the directory)
//   BM_CapsuleDecode/N         DecodeCapsule: digest + signature, zstd, wire limits, parse,
//                              ValidateCapsule
//   BM_Sha256/N                OpenSSL's SHA-256 over the same N MiB, already in memory: the
//                              bound of both directions, which hash every payload byte once
// format_torch_bench.cc adds torch::save and torch::load of the same tensors, so that the ratios
// ours / torch and ours / SHA-256 come from one run. Budget (README, Performance): encode
// >= 300 MB/s and >= torch::save; decode >= 1 GB/s at every size.
//
// `page_faults` is the number of first touches of fresh memory per iteration. Under some
// hypervisors each costs 15-20 us, so 4 KiB pages fill at about 200 MB/s: a run whose faults grow
// with N is measuring the allocator's handing back and taking again of memory as much as the code.
//
//   capsule_bench --benchmark_filter='Capsule|Torch|Sha' --benchmark_repetitions=3
//                 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "capsule/base/internal/sha256.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/proto/capsule.pb.h"
#include "samples/golden/golden_capsules.h"

namespace capsule {
namespace bench {

constexpr int64_t kTensorFloats = int64_t{1} << 18;  // 512 x 512 float32: 1 MiB

// N MiB of activations-like data: normal floats, whose random mantissas barely compress (the
// honest case for tensor payloads). Tensor i is floats [i << 18, (i + 1) << 18). Made once per N.
const std::vector<float>& TensorData(int mib) {
  static std::map<int, std::vector<float>> cache;
  std::vector<float>& v = cache[mib];
  if (v.empty()) {
    v.resize(static_cast<size_t>(mib) * kTensorFloats);
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (float& x : v) x = dist(rng);
  }
  return v;
}

void PayloadSizes(benchmark::internal::Benchmark* b) {
  for (int mib : {1, 16, 64, 256}) b->Arg(mib);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

long MinorFaults() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// Bytes processed (the tensor payload), and the page faults since `faults_before`, per iteration.
void ReportPayload(benchmark::State& state, int mib, long faults_before) {
  state.SetBytesProcessed(state.iterations() * (int64_t{mib} << 20));
  state.counters["page_faults"] = benchmark::Counter(
      static_cast<double>(MinorFaults() - faults_before), benchmark::Counter::kAvgIterations);
}

}  // namespace bench

namespace {

using bench::MinorFaults;
using bench::PayloadSizes;
using bench::ReportPayload;

const v1::Capsule& CapsuleWithTensors(int mib) {
  static std::map<int, v1::Capsule> cache;
  v1::Capsule& c = cache[mib];
  if (c.tensors_size() == 0) {
    c = golden::MakeFullCapsule();
    const std::vector<float>& data = bench::TensorData(mib);
    for (int i = 0; i < mib; ++i) {
      const float* first = data.data() + i * bench::kTensorFloats;
      *c.add_tensors() = golden::MakeFloatBlob("bench." + std::to_string(i), {512, 512},
                                               {first, first + bench::kTensorFloats});
    }
  }
  return c;
}

const KeyPair& Keys() {
  static const KeyPair pair = *GenerateKeyPair();
  return pair;
}

// The codec alone: the bench measures encoding, and decoding measures validation.
WriteOptions CodecOptions() {
  WriteOptions options;
  options.signing_key = &Keys().private_key;
  options.validate = false;
  return options;
}

void EncodeLoop(benchmark::State& state, const WriteOptions& options) {
  const int mib = static_cast<int>(state.range(0));
  const v1::Capsule& c = CapsuleWithTensors(mib);
  size_t out_size = 0;
  const long faults = MinorFaults();
  for (auto _ : state) {
    auto bytes = EncodeCapsule(c, options);
    if (!bytes.ok()) {
      state.SkipWithError(bytes.status().ToString().c_str());
      return;
    }
    out_size = bytes->size();
    benchmark::DoNotOptimize(bytes->data());
  }
  ReportPayload(state, mib, faults);
  state.counters["ratio"] = static_cast<double>(out_size) / (int64_t{mib} << 20);
}

void BM_CapsuleEncode(benchmark::State& state) { EncodeLoop(state, CodecOptions()); }

void BM_CapsuleEncodeChecked(benchmark::State& state) {
  WriteOptions options;
  options.signing_key = &Keys().private_key;
  EncodeLoop(state, options);
}

void BM_CapsuleWriteFile(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const v1::Capsule& c = CapsuleWithTensors(mib);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "capsule-bench-io";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "format_bench.capsule").string();
  const WriteOptions options = CodecOptions();
  const long faults = MinorFaults();
  for (auto _ : state) {
    // A new file each time, as captures write: replacing one would also time freeing its blocks.
    state.PauseTiming();
    std::filesystem::remove(path);
    state.ResumeTiming();
    const Status s = WriteCapsuleFile(path, c, options);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  ReportPayload(state, mib, faults);
  std::filesystem::remove(path);
}

void BM_CapsuleDecode(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  WriteOptions woptions;
  woptions.signing_key = &Keys().private_key;
  const std::string bytes = *EncodeCapsule(CapsuleWithTensors(mib), woptions);
  ReadOptions options;
  options.trusted_keys.push_back(Keys().public_key);
  const long faults = MinorFaults();
  for (auto _ : state) {
    auto decoded = DecodeCapsule(bytes, options);
    if (!decoded.ok()) {
      state.SkipWithError(decoded.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(decoded->capsule.get());
  }
  ReportPayload(state, mib, faults);
}

void BM_Sha256(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const std::vector<float>& data = bench::TensorData(mib);
  const std::string_view bytes(reinterpret_cast<const char*>(data.data()),
                               data.size() * sizeof(float));
  const long faults = MinorFaults();
  for (auto _ : state) benchmark::DoNotOptimize(*Sha256(bytes));
  ReportPayload(state, mib, faults);
}

BENCHMARK(BM_CapsuleEncode)->Apply(PayloadSizes);
BENCHMARK(BM_CapsuleEncodeChecked)->Apply(PayloadSizes);
BENCHMARK(BM_CapsuleWriteFile)->Apply(PayloadSizes);
BENCHMARK(BM_CapsuleDecode)->Apply(PayloadSizes);
BENCHMARK(BM_Sha256)->Apply(PayloadSizes);

}  // namespace
}  // namespace capsule
