#include "capsule/model/spec_config.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

#include "capsule/format/json.h"

namespace capsule {

namespace {
constexpr uint64_t kExactInteger = uint64_t{1} << 53;  // the largest run of integers a double holds
}  // namespace

struct SpecConfig::Impl {
  google::protobuf::Struct fields;
};

SpecConfig::SpecConfig() : impl_(std::make_unique<Impl>()) {}
SpecConfig::~SpecConfig() = default;
SpecConfig::SpecConfig(const SpecConfig& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
SpecConfig& SpecConfig::operator=(const SpecConfig& other) {
  if (this != &other) *impl_ = *other.impl_;
  return *this;
}
SpecConfig::SpecConfig(SpecConfig&&) noexcept = default;
SpecConfig& SpecConfig::operator=(SpecConfig&&) noexcept = default;

StatusOr<SpecConfig> SpecConfig::Parse(std::string_view json) {
  SpecConfig config;
  const auto st = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &config.impl_->fields);
  if (!st.ok()) {
    return InvalidArgumentError("model config is not a JSON object: " + std::string(st.message()));
  }
  return config;
}

SpecConfig& SpecConfig::Set(const std::string& key, double value) {
  (*impl_->fields.mutable_fields())[key].set_number_value(value);
  return *this;
}
SpecConfig& SpecConfig::Set(const std::string& key, int64_t value) {
  return Set(key, static_cast<double>(value));
}
SpecConfig& SpecConfig::Set(const std::string& key, uint64_t value) {
  if (value <= kExactInteger) return Set(key, static_cast<double>(value));
  return Set(key, std::to_string(value));
}
SpecConfig& SpecConfig::Set(const std::string& key, bool value) {
  (*impl_->fields.mutable_fields())[key].set_bool_value(value);
  return *this;
}
SpecConfig& SpecConfig::Set(const std::string& key, const std::string& value) {
  (*impl_->fields.mutable_fields())[key].set_string_value(value);
  return *this;
}

bool SpecConfig::Has(const std::string& key) const { return impl_->fields.fields().count(key) > 0; }

std::vector<std::string> SpecConfig::Keys() const {
  std::vector<std::string> keys;
  for (const auto& [key, value] : impl_->fields.fields()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

namespace {

StatusOr<const google::protobuf::Value*> Find(const google::protobuf::Struct& s,
                                              const std::string& key,
                                              google::protobuf::Value::KindCase kind,
                                              const char* what) {
  const auto it = s.fields().find(key);
  if (it == s.fields().end()) return NotFoundError("model config has no \"" + key + "\"");
  if (it->second.kind_case() != kind) {
    return InvalidArgumentError("model config \"" + key + "\": not " + what);
  }
  return &it->second;
}

}  // namespace

StatusOr<double> SpecConfig::GetDouble(const std::string& key) const {
  CAPSULE_ASSIGN_OR_RETURN(
      const google::protobuf::Value* v,
      Find(impl_->fields, key, google::protobuf::Value::kNumberValue, "a number"));
  return v->number_value();
}

StatusOr<int64_t> SpecConfig::GetInt(const std::string& key) const {
  CAPSULE_ASSIGN_OR_RETURN(const double v, GetDouble(key));
  if (!(std::fabs(v) <= static_cast<double>(kExactInteger)) || std::floor(v) != v) {
    return InvalidArgumentError("model config \"" + key + "\": not an integer");
  }
  return static_cast<int64_t>(v);
}

StatusOr<uint64_t> SpecConfig::GetUint(const std::string& key) const {
  const auto it = impl_->fields.fields().find(key);
  if (it != impl_->fields.fields().end() &&
      it->second.kind_case() == google::protobuf::Value::kStringValue) {
    // Above 2^53 the value is a decimal string (Set(key, uint64_t)).
    const std::string& digits = it->second.string_value();
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(digits.c_str(), &end, 10);
    if (digits.empty() || digits.size() > 20 ||
        !std::isdigit(static_cast<unsigned char>(digits[0])) || *end != '\0' || errno == ERANGE) {
      return InvalidArgumentError("model config \"" + key + "\": not an unsigned integer");
    }
    return uint64_t{v};
  }
  CAPSULE_ASSIGN_OR_RETURN(const int64_t v, GetInt(key));
  if (v < 0) return InvalidArgumentError("model config \"" + key + "\": not an unsigned integer");
  return static_cast<uint64_t>(v);
}

StatusOr<bool> SpecConfig::GetBool(const std::string& key) const {
  CAPSULE_ASSIGN_OR_RETURN(
      const google::protobuf::Value* v,
      Find(impl_->fields, key, google::protobuf::Value::kBoolValue, "true or false"));
  return v->bool_value();
}

StatusOr<std::string> SpecConfig::GetString(const std::string& key) const {
  CAPSULE_ASSIGN_OR_RETURN(
      const google::protobuf::Value* v,
      Find(impl_->fields, key, google::protobuf::Value::kStringValue, "a string"));
  return v->string_value();
}

StatusOr<double> SpecConfig::GetDouble(const std::string& key, double fallback) const {
  return Has(key) ? GetDouble(key) : StatusOr<double>(fallback);
}
StatusOr<int64_t> SpecConfig::GetInt(const std::string& key, int64_t fallback) const {
  return Has(key) ? GetInt(key) : StatusOr<int64_t>(fallback);
}
StatusOr<uint64_t> SpecConfig::GetUint(const std::string& key, uint64_t fallback) const {
  return Has(key) ? GetUint(key) : StatusOr<uint64_t>(fallback);
}
StatusOr<bool> SpecConfig::GetBool(const std::string& key, bool fallback) const {
  return Has(key) ? GetBool(key) : StatusOr<bool>(fallback);
}

std::string SpecConfig::ToJson() const {
  // protobuf's map iteration order is unspecified: print from a sorted copy, one key at a time.
  const std::map<std::string, google::protobuf::Value> sorted(impl_->fields.fields().begin(),
                                                              impl_->fields.fields().end());
  std::string out = "{";
  for (const auto& [key, value] : sorted) {
    google::protobuf::Value k;
    k.set_string_value(key);
    out += (out.size() > 1 ? "," : "") + MessageToJson(k) + ":" + MessageToJson(value);
  }
  return out + "}";
}

}  // namespace capsule
