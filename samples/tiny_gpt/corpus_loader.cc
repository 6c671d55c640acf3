#include "samples/tiny_gpt/corpus_loader.h"

#include <ATen/ATen.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace capsule::tiny_gpt {

std::string DefaultDataDir() {
  const char* env = std::getenv("CAPSULE_TINY_GPT_DATA_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return CAPSULE_TINY_GPT_DATA_DIR;
}

std::string CorpusPath() { return DefaultDataDir() + "/corpus.txt"; }
std::string TokenizerPath() { return DefaultDataDir() + "/tokenizer.json"; }
std::string ChatTemplatePath() { return DefaultDataDir() + "/chat_template.txt"; }

StatusOr<CorpusLoader> CorpusLoader::Open(const std::string& path,
                                          const CorpusLoaderOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(errno, "open corpus", path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return ErrnoError(errno, "read corpus", path);
  return FromText(bytes.str(), options);
}

StatusOr<CorpusLoader> CorpusLoader::FromText(std::string corpus,
                                              const CorpusLoaderOptions& options) {
  if (options.batch_size < 1 || options.seq_len < 1) {
    return InvalidArgumentError("tiny_gpt loader: batch_size and seq_len must be >= 1");
  }
  if (static_cast<int64_t>(corpus.size()) < options.seq_len + 1) {
    return InvalidArgumentError("tiny_gpt loader: corpus of " + std::to_string(corpus.size()) +
                                " bytes is shorter than seq_len + 1 (" +
                                std::to_string(options.seq_len + 1) + ")");
  }
  return CorpusLoader(std::move(corpus), options);
}

CorpusLoader::CorpusLoader(std::string corpus, const CorpusLoaderOptions& options)
    : corpus_(std::move(corpus)), options_(options), rng_(options.seed) {}

int64_t CorpusLoader::num_start_offsets() const {
  return static_cast<int64_t>(corpus_.size()) - options_.seq_len;
}

int64_t CorpusLoader::sequences_per_epoch() const {
  return std::max<int64_t>(1, static_cast<int64_t>(corpus_.size()) / options_.seq_len);
}

CorpusBatch CorpusLoader::Next() {
  const int64_t b = options_.batch_size;
  const int64_t t = options_.seq_len;
  CorpusBatch out;
  out.cursor = cursor_;
  at::Tensor ids = at::empty({b, t}, at::kLong);
  at::Tensor labels = at::empty({b, t}, at::kLong);
  int64_t* ip = ids.data_ptr<int64_t>();
  int64_t* lp = labels.data_ptr<int64_t>();
  const uint64_t starts = static_cast<uint64_t>(num_start_offsets());
  for (int64_t s = 0; s < b; ++s) {
    // Plain modulo, not std::uniform_int_distribution, whose algorithm differs between standard
    // libraries: the batch must be a function of the saved state alone. The modulo bias is below
    // 2^-40 for corpora under 16 MiB.
    const int64_t start = static_cast<int64_t>(rng_() % starts);
    out.cursor.sample_indices.push_back(start);
    out.raw_text.push_back(corpus_.substr(start, t + 1));
    for (int64_t j = 0; j < t; ++j) {
      ip[s * t + j] = static_cast<unsigned char>(corpus_[start + j]);
      lp[s * t + j] = static_cast<unsigned char>(corpus_[start + j + 1]);
    }
  }
  out.batch.input_ids = ids;
  out.batch.labels = labels;
  out.batch.attention_mask = at::ones({b, t}, at::kLong);
  out.batch.loss_mask = at::ones({b, t}, at::kLong);
  out.batch.labels_shifted = true;

  cursor_.offset += b;
  cursor_.epoch += cursor_.offset / sequences_per_epoch();
  cursor_.offset %= sequences_per_epoch();
  return out;
}

std::string CorpusLoader::SaveRngState() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

Status CorpusLoader::RestoreRngState(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail()) {
    return InvalidArgumentError("tiny_gpt loader: not a sampler RNG state (" +
                                std::to_string(state.size()) + " bytes)");
  }
  in >> std::ws;
  if (!in.eof()) return InvalidArgumentError("tiny_gpt loader: trailing bytes after RNG state");
  rng_ = restored;
  return Status::Ok();
}

void CorpusLoader::set_cursor(const DataCursor& cursor) {
  cursor_ = cursor;
  cursor_.sample_indices.clear();
}

}  // namespace capsule::tiny_gpt
