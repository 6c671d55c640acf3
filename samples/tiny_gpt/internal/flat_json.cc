#include "samples/tiny_gpt/internal/flat_json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace capsule::tiny_gpt::internal {
namespace {

Status SyntaxError(std::string_view what, size_t pos) {
  return InvalidArgumentError("tiny_gpt config: " + std::string(what) + " at byte " +
                              std::to_string(pos) + " (want a flat JSON object)");
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  StatusOr<FlatJsonObject> Object() {
    FlatJsonObject obj;
    SkipSpace();
    if (!Eat('{')) return SyntaxError("expected '{'", pos_);
    SkipSpace();
    if (Eat('}')) return Finish(std::move(obj));
    while (true) {
      SkipSpace();
      const size_t key_pos = pos_;
      CAPSULE_ASSIGN_OR_RETURN(std::string key, String());
      SkipSpace();
      if (!Eat(':')) return SyntaxError("expected ':'", pos_);
      SkipSpace();
      CAPSULE_ASSIGN_OR_RETURN(FlatJsonValue value, Value());
      if (!obj.emplace(key, std::move(value)).second) {
        return SyntaxError("duplicate key \"" + key + "\"", key_pos);
      }
      SkipSpace();
      if (Eat('}')) return Finish(std::move(obj));
      if (!Eat(',')) return SyntaxError("expected ',' or '}'", pos_);
    }
  }

 private:
  StatusOr<FlatJsonObject> Finish(FlatJsonObject obj) {
    SkipSpace();
    if (pos_ != text_.size()) return SyntaxError("trailing bytes", pos_);
    return obj;
  }

  StatusOr<FlatJsonValue> Value() {
    FlatJsonValue value;
    if (pos_ < text_.size() && text_[pos_] == '"') {
      value.type = FlatJsonValue::Type::kString;
      CAPSULE_ASSIGN_OR_RETURN(value.text, String());
      return value;
    }
    if (text_.substr(pos_, 4) == "true" || text_.substr(pos_, 5) == "false") {
      value.type = FlatJsonValue::Type::kBool;
      value.boolean = text_[pos_] == 't';
      pos_ += value.boolean ? 4 : 5;
      return value;
    }
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           std::string_view("+-.0123456789eE").find(text_[pos_]) != std::string_view::npos) {
      ++pos_;
    }
    if (pos_ == start) return SyntaxError("expected a number, string or boolean", start);
    value.text = std::string(text_.substr(start, pos_ - start));
    return value;
  }

  StatusOr<std::string> String() {
    const size_t start = pos_;
    if (!Eat('"')) return SyntaxError("expected a string", pos_);
    std::string out;
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) return SyntaxError("control byte in string", pos_);
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          // Only the escapes FlatJsonWriter produces (control bytes) are needed.
          const std::string hex(text_.substr(pos_, 4));
          char* end = nullptr;
          const long code = std::strtol(hex.c_str(), &end, 16);
          if (hex.size() != 4 || *end != '\0' || code > 0x7f) {
            return SyntaxError("unsupported \\u escape", pos_);
          }
          out += static_cast<char>(code);
          pos_ += 4;
          break;
        }
        default:
          return SyntaxError("bad escape", pos_);
      }
    }
    return SyntaxError("unterminated string", start);
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

StatusOr<const FlatJsonValue*> Find(const FlatJsonObject& obj, const std::string& key,
                                    FlatJsonValue::Type type, const char* type_name) {
  const auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgumentError("tiny_gpt config: missing \"" + key + "\"");
  if (it->second.type != type) {
    return InvalidArgumentError("tiny_gpt config: \"" + key + "\" must be a " + type_name);
  }
  return &it->second;
}

Status NotA(const std::string& key, const char* what) {
  return InvalidArgumentError("tiny_gpt config: \"" + key + "\" must be " + what);
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

StatusOr<FlatJsonObject> ParseFlatJsonObject(std::string_view text) {
  return Parser(text).Object();
}

StatusOr<int64_t> GetInt(const FlatJsonObject& obj, const std::string& key) {
  CAPSULE_ASSIGN_OR_RETURN(const FlatJsonValue* v,
                           Find(obj, key, FlatJsonValue::Type::kNumber, "number"));
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(v->text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return NotA(key, "an integer");
  return static_cast<int64_t>(value);
}

StatusOr<uint64_t> GetUint(const FlatJsonObject& obj, const std::string& key) {
  CAPSULE_ASSIGN_OR_RETURN(const FlatJsonValue* v,
                           Find(obj, key, FlatJsonValue::Type::kNumber, "number"));
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(v->text.c_str(), &end, 10);
  if (v->text[0] == '-' || *end != '\0' || errno != 0) return NotA(key, "an unsigned integer");
  return static_cast<uint64_t>(value);
}

StatusOr<double> GetDouble(const FlatJsonObject& obj, const std::string& key) {
  CAPSULE_ASSIGN_OR_RETURN(const FlatJsonValue* v,
                           Find(obj, key, FlatJsonValue::Type::kNumber, "number"));
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(v->text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(value)) return NotA(key, "a finite number");
  return value;
}

StatusOr<std::string> GetString(const FlatJsonObject& obj, const std::string& key) {
  CAPSULE_ASSIGN_OR_RETURN(const FlatJsonValue* v,
                           Find(obj, key, FlatJsonValue::Type::kString, "string"));
  return v->text;
}

StatusOr<bool> GetBool(const FlatJsonObject& obj, const std::string& key) {
  CAPSULE_ASSIGN_OR_RETURN(const FlatJsonValue* v,
                           Find(obj, key, FlatJsonValue::Type::kBool, "boolean"));
  return v->boolean;
}

void FlatJsonWriter::AddRaw(const std::string& key, const std::string& literal) {
  if (text_.size() > 1) text_ += ",";
  text_ += Quote(key) + ":" + literal;
}

void FlatJsonWriter::Add(const std::string& key, int64_t value) {
  AddRaw(key, std::to_string(value));
}

void FlatJsonWriter::Add(const std::string& key, uint64_t value) {
  AddRaw(key, std::to_string(value));
}

void FlatJsonWriter::Add(const std::string& key, double value) {
  // The shortest of %.15g / %.17g that reads back to the same double: exact, yet "1e-05" stays
  // readable instead of becoming "1.0000000000000001e-05".
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", value);
  if (std::strtod(buf, nullptr) != value) std::snprintf(buf, sizeof(buf), "%.17g", value);
  AddRaw(key, buf);
}

void FlatJsonWriter::Add(const std::string& key, const std::string& value) {
  AddRaw(key, Quote(value));
}

void FlatJsonWriter::Add(const std::string& key, bool value) {
  AddRaw(key, value ? "true" : "false");
}

}  // namespace capsule::tiny_gpt::internal
