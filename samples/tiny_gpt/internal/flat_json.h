// A flat JSON object of numbers, strings and booleans: the form of tiny_gpt's model config.
//
// The config travels inside capsules as text and replay rebuilds the model from it, so it has to be
// exact (numbers are written with 17 significant digits) and readable by a stranger; nesting is
// never needed, and a flat object keeps the parser small enough to review in one sitting.
//
//   FlatJsonWriter w;
//   w.Add("d_model", int64_t{64});
//   std::string text = w.Finish();   // {"d_model":64}
//   CAPSULE_ASSIGN_OR_RETURN(FlatJsonObject obj, ParseFlatJsonObject(text));
//
// Thread safety: values and pure functions.
#ifndef CAPSULE_SAMPLES_TINY_GPT_INTERNAL_FLAT_JSON_H_
#define CAPSULE_SAMPLES_TINY_GPT_INTERNAL_FLAT_JSON_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "capsule/base/status.h"

namespace capsule::tiny_gpt::internal {

struct FlatJsonValue {
  enum class Type { kNumber, kString, kBool };
  Type type = Type::kNumber;
  std::string text;  // the number's literal as written, or the decoded string
  bool boolean = false;
};

using FlatJsonObject = std::map<std::string, FlatJsonValue>;

// Parses one JSON object whose values are numbers, strings or booleans. Duplicate keys, nesting,
// null and trailing bytes are rejected with kInvalidArgument.
StatusOr<FlatJsonObject> ParseFlatJsonObject(std::string_view text);

// Typed reads of one member; `key` must be present.
StatusOr<int64_t> GetInt(const FlatJsonObject& obj, const std::string& key);
StatusOr<uint64_t> GetUint(const FlatJsonObject& obj, const std::string& key);
StatusOr<double> GetDouble(const FlatJsonObject& obj, const std::string& key);
StatusOr<std::string> GetString(const FlatJsonObject& obj, const std::string& key);
StatusOr<bool> GetBool(const FlatJsonObject& obj, const std::string& key);

// Writes members in the order they are added.
class FlatJsonWriter {
 public:
  void Add(const std::string& key, int64_t value);
  void Add(const std::string& key, uint64_t value);
  void Add(const std::string& key, double value);
  void Add(const std::string& key, const std::string& value);
  void Add(const std::string& key, bool value);
  std::string Finish() const { return text_ + "}"; }

 private:
  void AddRaw(const std::string& key, const std::string& literal);
  std::string text_ = "{";
};

}  // namespace capsule::tiny_gpt::internal

#endif  // CAPSULE_SAMPLES_TINY_GPT_INTERNAL_FLAT_JSON_H_
