// SpecConfig: a model's construction config as the JSON object ModelSpecInfo::config_json holds.
//
// Replay rebuilds a model from the config the capsule stored, so a model author writes the config
// once and reads it back once. SpecConfig does both through protobuf's JSON mapping
// (google.protobuf.Struct): no hand-written printer or parser, and the text is plain JSON that
// `capsule inspect --json` shows as is.
//
//   capsule::SpecConfig config;
//   config.Set("hidden", 64).Set("lr", 3e-4).Set("act", "relu").Set("bias", true);
//   std::string json = config.ToJson();           // {"act":"relu","bias":true,"hidden":64,...}
//   CAPSULE_ASSIGN_OR_RETURN(capsule::SpecConfig back, capsule::SpecConfig::Parse(json));
//   CAPSULE_ASSIGN_OR_RETURN(int64_t hidden, back.GetInt("hidden"));
//   int64_t layers = back.GetInt("layers", 2);    // with a default when the key is absent
//
// Numbers are doubles in JSON: GetInt refuses a value that is not an integer within 2^53. An
// unsigned 64-bit value (a seed) is written as a number up to 2^53 and as a decimal string above
// it, as protobuf's JSON mapping writes 64-bit integers; GetUint reads either form exactly.
// Thread safety: a SpecConfig is used from one thread at a time.
#ifndef CAPSULE_MODEL_SPEC_CONFIG_H_
#define CAPSULE_MODEL_SPEC_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"

namespace capsule {

class SpecConfig {
 public:
  SpecConfig();
  ~SpecConfig();
  SpecConfig(const SpecConfig& other);
  SpecConfig& operator=(const SpecConfig& other);
  SpecConfig(SpecConfig&&) noexcept;
  SpecConfig& operator=(SpecConfig&&) noexcept;

  // kInvalidArgument unless `json` is one JSON object.
  static StatusOr<SpecConfig> Parse(std::string_view json);

  SpecConfig& Set(const std::string& key, double value);
  SpecConfig& Set(const std::string& key, int64_t value);
  SpecConfig& Set(const std::string& key, int value) { return Set(key, int64_t{value}); }
  SpecConfig& Set(const std::string& key, uint64_t value);
  SpecConfig& Set(const std::string& key, bool value);
  SpecConfig& Set(const std::string& key, const std::string& value);
  SpecConfig& Set(const std::string& key, const char* value) {
    return Set(key, std::string(value));
  }

  bool Has(const std::string& key) const;
  // Every key, sorted (to refuse keys a model does not know).
  std::vector<std::string> Keys() const;

  // kNotFound when absent, kInvalidArgument when of another type ("hidden: not an integer").
  StatusOr<double> GetDouble(const std::string& key) const;
  StatusOr<int64_t> GetInt(const std::string& key) const;
  StatusOr<uint64_t> GetUint(const std::string& key) const;
  StatusOr<bool> GetBool(const std::string& key) const;
  StatusOr<std::string> GetString(const std::string& key) const;
  // The same with a default for an absent key (a value of another type is still an error).
  StatusOr<double> GetDouble(const std::string& key, double fallback) const;
  StatusOr<int64_t> GetInt(const std::string& key, int64_t fallback) const;
  StatusOr<uint64_t> GetUint(const std::string& key, uint64_t fallback) const;
  StatusOr<bool> GetBool(const std::string& key, bool fallback) const;

  // One line, keys sorted: the same config always gives the same text (and model hash).
  std::string ToJson() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace capsule

#endif  // CAPSULE_MODEL_SPEC_CONFIG_H_
