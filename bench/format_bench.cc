// Capsule codec throughput: encode (serialize + zstd + sign) and decode (verify + decompress +
// parse + validate) of a capsule carrying N MiB of float32 tensor data, as bytes of tensor payload
// per second. Budget (README, Performance): encode >= 300 MB/s, decode >= 1 GB/s at the default
// level.
//
//   build/bench/capsule_bench --benchmark_filter=Capsule --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <random>

#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/proto/capsule.pb.h"
#include "samples/golden/golden_capsules.h"

namespace capsule {
namespace {

// Activations-like data: normal floats. Random mantissas barely compress, which is the honest case
// for tensor payloads.
v1::Capsule CapsuleWithTensors(int mib) {
  v1::Capsule c = golden::MakeFullCapsule();
  const size_t per_tensor = size_t{1} << 18;  // 1 MiB of float32
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int i = 0; i < mib; ++i) {
    std::vector<float> v(per_tensor);
    for (float& x : v) x = dist(rng);
    *c.add_tensors() = golden::MakeFloatBlob("bench." + std::to_string(i), {512, 512}, v);
  }
  return c;
}

struct Keys {
  KeyPair pair;
  Keys() : pair(*GenerateKeyPair()) {}
};

void BM_CapsuleEncode(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const v1::Capsule c = CapsuleWithTensors(mib);
  Keys keys;
  WriteOptions options;
  options.signing_key = &keys.pair.private_key;
  options.validate = false;  // the bench measures the codec; validation is measured in decode
  size_t out_size = 0;
  for (auto _ : state) {
    auto bytes = EncodeCapsule(c, options);
    if (!bytes.ok()) state.SkipWithError(bytes.status().ToString().c_str());
    out_size = bytes->size();
    benchmark::DoNotOptimize(bytes->data());
  }
  state.SetBytesProcessed(state.iterations() * int64_t{mib} << 20);
  state.counters["ratio"] = static_cast<double>(out_size) / (int64_t{mib} << 20);
}

void BM_CapsuleDecode(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  Keys keys;
  WriteOptions woptions;
  woptions.signing_key = &keys.pair.private_key;
  const std::string bytes = *EncodeCapsule(CapsuleWithTensors(mib), woptions);
  ReadOptions options;
  options.trusted_keys.push_back(keys.pair.public_key);
  for (auto _ : state) {
    auto decoded = DecodeCapsule(bytes, options);
    if (!decoded.ok()) state.SkipWithError(decoded.status().ToString().c_str());
    benchmark::DoNotOptimize(decoded->capsule.get());
  }
  state.SetBytesProcessed(state.iterations() * int64_t{mib} << 20);
}

BENCHMARK(BM_CapsuleEncode)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CapsuleDecode)->Arg(1)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace capsule
