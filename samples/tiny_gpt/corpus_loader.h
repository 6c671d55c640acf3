// CorpusLoader: a deterministic, resumable source of training batches from a byte corpus.
//
// tiny_gpt is byte-level: token id = byte value, so the "tokenizer" is the identity and
// data/tokenizer.json only documents it. Each sequence is a window of seq_len + 1 bytes starting at
// an offset drawn by the sampler RNG (std::mt19937_64); inputs are its first seq_len bytes and the
// labels, already shifted, its last seq_len. The sampler state alone decides the next batch, so a
// capsule that stores SaveRngState() before a step can regenerate that step's batch exactly.
//
//   CAPSULE_ASSIGN_OR_RETURN(CorpusLoader loader, CorpusLoader::Open(CorpusPath(), {}));
//   std::string rng = loader.SaveRngState();
//   CorpusBatch b = loader.Next();                  // b.batch feeds a LayerSequence
//   CAPSULE_RETURN_IF_ERROR(loader.RestoreRngState(rng));   // the next Next() repeats b
//
// Thread safety: a CorpusLoader is used from one thread at a time.
#ifndef CAPSULE_SAMPLES_TINY_GPT_CORPUS_LOADER_H_
#define CAPSULE_SAMPLES_TINY_GPT_CORPUS_LOADER_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/model/layer_sequence.h"

namespace capsule::tiny_gpt {

// The sample's data folder: $CAPSULE_TINY_GPT_DATA_DIR when set, else the source tree's
// samples/tiny_gpt/data. It holds corpus.txt, tokenizer.json and chat_template.txt.
std::string DefaultDataDir();
std::string CorpusPath();        // DefaultDataDir() + "/corpus.txt"
std::string TokenizerPath();     // DefaultDataDir() + "/tokenizer.json"
std::string ChatTemplatePath();  // DefaultDataDir() + "/chat_template.txt"

struct CorpusLoaderOptions {
  int64_t batch_size = 8;  // sequences per batch; >= 1
  int64_t seq_len = 32;    // tokens per sequence; the corpus needs at least seq_len + 1 bytes
  uint64_t seed = 0;       // sampler RNG seed
};

// Where a batch came from (capsule's data cursor).
struct DataCursor {
  int64_t epoch = 0;   // completed passes; one pass = as many sequences as fit end to end
  int64_t shard = 0;   // the corpus is a single shard
  int64_t offset = 0;  // sequences served earlier in this epoch
  std::vector<int64_t> sample_indices;  // start byte of each sequence of the batch
};

struct CorpusBatch {
  LayerBatch batch;   // input_ids, labels (shifted), attention_mask and loss_mask (all ones)
  DataCursor cursor;  // the cursor before this batch, with its sample indices
  std::vector<std::string> raw_text;  // the seq_len + 1 bytes behind each sequence
};

class CorpusLoader {
 public:
  // kNotFound when the file is missing; kInvalidArgument when options are bad or the corpus is
  // shorter than seq_len + 1 bytes.
  static StatusOr<CorpusLoader> Open(const std::string& path, const CorpusLoaderOptions& options);
  static StatusOr<CorpusLoader> FromText(std::string corpus, const CorpusLoaderOptions& options);

  // The next batch; advances the sampler and the cursor.
  CorpusBatch Next();

  // The sampler RNG state as text (the standard's portable mt19937_64 serialisation).
  std::string SaveRngState() const;
  // kInvalidArgument when `state` is not a SaveRngState() result; the loader is unchanged then.
  Status RestoreRngState(const std::string& state);

  // The cursor the next batch will carry (without sample indices); set_cursor resumes counting.
  const DataCursor& cursor() const { return cursor_; }
  void set_cursor(const DataCursor& cursor);

  const std::string& text() const { return corpus_; }
  const CorpusLoaderOptions& options() const { return options_; }
  int64_t num_start_offsets() const;  // sequences the sampler can choose from
  int64_t sequences_per_epoch() const;

 private:
  CorpusLoader(std::string corpus, const CorpusLoaderOptions& options);

  std::string corpus_;
  CorpusLoaderOptions options_;
  std::mt19937_64 rng_;
  DataCursor cursor_;
};

}  // namespace capsule::tiny_gpt

#endif  // CAPSULE_SAMPLES_TINY_GPT_CORPUS_LOADER_H_
