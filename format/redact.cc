#include "capsule/format/redact.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <iterator>
#include <set>
#include <string_view>
#include <utility>

#include "capsule/base/internal/sha256.h"
#include "capsule/proto/capsule.pb.h"

namespace capsule {
namespace {

constexpr char kRedactedMark[] = "<redacted>";

// A log line is dropped when it shares this many consecutive bytes with a sample's raw text: long
// enough that ordinary log words ("loss", "step") never match, short enough that a sample printed
// truncated, or split over lines, is still caught. Texts shorter than this match only whole.
constexpr size_t kTextWindow = 16;

// Removes the elements `drop` selects, keeping the order of the rest.
template <typename Repeated, typename Pred>
void EraseIf(Repeated* items, Pred drop) {
  int kept = 0;
  for (int i = 0; i < items->size(); ++i) {
    if (drop(items->Get(i))) continue;
    if (kept != i) items->SwapElements(kept, i);
    ++kept;
  }
  items->DeleteSubrange(kept, items->size() - kept);
}

// Every kTextWindow-byte piece of every raw text (the whole text when shorter), kept as sorted
// 64-bit hashes: 8 bytes a window, where a set of views cost about 50 (a 16 MiB raw text, the
// most a reader accepts, made 800 MB). A hash collision only drops an innocent line: it errs on
// the side of removing.
class TextMatcher {
 public:
  explicit TextMatcher(const v1::DataBatch& data) {
    for (const auto& s : data.sequences()) {
      const std::string& t = s.raw_text().empty() ? s.raw_bytes() : s.raw_text();
      if (t.empty()) continue;
      if (t.size() < kTextWindow) {
        short_.push_back(t);
        continue;
      }
      for (size_t i = 0; i + kTextWindow <= t.size(); ++i) {
        windows_.push_back(Hash(std::string_view(t).substr(i, kTextWindow)));
      }
    }
    std::sort(windows_.begin(), windows_.end());
    windows_.erase(std::unique(windows_.begin(), windows_.end()), windows_.end());
  }

  bool empty() const { return short_.empty() && windows_.empty(); }

  bool Leaks(std::string_view line) const {
    for (const std::string& s : short_) {
      if (line.find(s) != std::string_view::npos) return true;
    }
    for (size_t i = 0; i + kTextWindow <= line.size(); ++i) {
      if (std::binary_search(windows_.begin(), windows_.end(), Hash(line.substr(i, kTextWindow)))) {
        return true;
      }
    }
    return false;
  }

 private:
  static uint64_t Hash(std::string_view s) { return std::hash<std::string_view>()(s); }

  std::vector<std::string> short_;
  std::vector<uint64_t> windows_;
};

void RedactText(v1::Capsule* c) {
  const TextMatcher matcher(c->data());
  for (auto& s : *c->mutable_data()->mutable_sequences()) {
    s.clear_raw_text();
    s.clear_raw_bytes();
  }
  if (matcher.empty()) return;
  v1::LogRecord* log = c->mutable_log();
  auto leaks = [&](const std::string& line) { return matcher.Leaks(line); };
  EraseIf(log->mutable_lines(), leaks);
  EraseIf(log->mutable_backtrace(), leaks);
  if (matcher.Leaks(log->error())) log->set_error("<redacted: contained sample text>");
  if (matcher.Leaks(c->trigger().message())) {
    c->mutable_trigger()->set_message("<redacted: contained sample text>");
  }
}

bool IsIntegerDType(int dtype) {
  switch (dtype) {
    case v1::INT64:
    case v1::INT32:
    case v1::INT16:
    case v1::INT8:
    case v1::UINT8:
      return true;
    default:
      return false;
  }
}

Status RedactTokens(v1::Capsule* c) {
  for (auto& s : *c->mutable_data()->mutable_sequences()) {
    // A sequence redacted before keeps its hash: the ids are gone, re-hashing would hash nothing.
    if (s.token_ids_size() > 0 || s.token_ids_sha256().empty()) {
      const std::vector<int64_t> ids(s.token_ids().begin(), s.token_ids().end());
      CAPSULE_ASSIGN_OR_RETURN(std::string hash, TokenIdsSha256(ids));
      s.set_token_ids_sha256(hash);
      s.set_token_count(static_cast<int64_t>(ids.size()));
    }
    s.clear_token_ids();
    s.clear_labels();
  }
  // The first layer consumes the token ids as its input; an integer layer input is ids by
  // another name.
  const std::string first_layer = c->model().layers_size() > 0 ? c->model().layers(0) : "embed";
  std::set<std::string> removed;
  EraseIf(c->mutable_tensors(), [&](const v1::TensorBlob& t) {
    const bool drop =
        (t.role() == v1::BATCH_INPUT && (t.name() == "input_ids" || t.name() == "labels")) ||
        (t.role() == v1::LAYER_INPUT &&
         (t.layer() == first_layer || t.layer() == "embed" || IsIntegerDType(t.meta().dtype())));
    if (drop) removed.insert(t.name());
    return drop;
  });
  EraseIf(c->mutable_data()->mutable_tensor_names(),
          [&](const std::string& name) { return removed.count(name) > 0; });
  return Status::Ok();
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size())) {
    s->replace(at, from.size(), to);
  }
}

// Applies `edit` to every free-text field a path or host name may have been printed into.
template <typename Edit>
void EditFreeText(v1::Capsule* c, Edit edit) {
  v1::LogRecord* log = c->mutable_log();
  for (std::string& line : *log->mutable_lines()) edit(&line);
  for (std::string& line : *log->mutable_backtrace()) edit(&line);
  edit(log->mutable_error());
  edit(c->mutable_trigger()->mutable_message());
  edit(c->mutable_identity()->mutable_config_text());
}

void RedactPaths(v1::Capsule* c) {
  // Longest first, so a directory that prefixes another is not replaced inside it first.
  std::set<std::pair<size_t, std::string>, std::greater<>> dirs;
  for (auto& f : *c->mutable_identity()->mutable_files()) {
    const std::string base = BaseName(f.path());
    if (f.name().empty()) f.set_name(base);
    if (f.path() != base) {
      const std::string dir = f.path().substr(0, f.path().size() - base.size());
      if (dir.size() > 1) dirs.emplace(dir.size(), dir);
    }
    f.set_path(base);
  }
  // The checkpoint a capsule names keeps its base name, as the identity files do.
  if (c->model().has_weights_reference()) {
    v1::WeightsReference* ref = c->mutable_model()->mutable_weights_reference();
    const std::string base = BaseName(ref->path());
    if (ref->path() != base) {
      const std::string dir = ref->path().substr(0, ref->path().size() - base.size());
      if (dir.size() > 1) dirs.emplace(dir.size(), dir);
    }
    ref->set_path(base);
  }
  EditFreeText(c, [&](std::string* s) {
    // "dir/" then "dir": "/data/run/tok.json" becomes "tok.json", a bare "/data/run" a mark.
    for (const auto& [size, dir] : dirs) ReplaceAll(s, dir, "");
    for (const auto& [size, dir] : dirs) {
      std::string bare = dir;
      while (bare.size() > 1 && bare.back() == '/') bare.pop_back();
      ReplaceAll(s, bare, kRedactedMark);
    }
  });
}

void RedactHost(v1::Capsule* c) {
  const std::string host = c->environment().hostname();
  c->mutable_environment()->clear_hostname();
  // Two-letter names would match ordinary words; such a host name is not identifying either.
  if (host.size() < 3) return;
  EditFreeText(c, [&](std::string* s) { ReplaceAll(s, host, kRedactedMark); });
}

}  // namespace

StatusOr<RedactItems> ParseRedactItemList(std::string_view list) {
  RedactItems items;
  bool* const flags[] = {&items.text, &items.tokens, &items.paths, &items.host};
  if (list.empty()) return items;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    const std::string_view item = list.substr(start, comma - start);
    size_t i = 0;
    while (i < std::size(kRedactItemNames) && kRedactItemNames[i] != item) ++i;
    if (i == std::size(kRedactItemNames)) {
      const std::string what = item.empty() ? "empty item in \"" + std::string(list) + "\""
                                            : "unknown item to drop \"" + std::string(item) + "\"";
      return InvalidArgumentError(what + "; give some of " + JoinRedactItemNames(","));
    }
    *flags[i] = true;
    start = comma + 1;
  }
  return items;
}

std::string JoinRedactItemNames(std::string_view separator) {
  std::string out;
  for (const std::string_view name : kRedactItemNames) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

Status ParseRedactItems(std::string_view list, RedactOptions* options) {
  if (list.empty()) {
    return InvalidArgumentError("no item to drop; give some of " + JoinRedactItemNames(","));
  }
  CAPSULE_ASSIGN_OR_RETURN(const RedactItems items, ParseRedactItemList(list));
  options->text |= items.text;
  options->tokens |= items.tokens;
  options->paths |= items.paths;
  options->host |= items.host;
  return Status::Ok();
}

StatusOr<std::string> TokenIdsSha256(const std::vector<int64_t>& ids) {
  Sha256Hasher hasher;
  for (int64_t id : ids) {
    // Spelled out byte by byte: the hash must not depend on the host's byte order.
    const uint64_t u = static_cast<uint64_t>(id);
    unsigned char le[8];
    for (int b = 0; b < 8; ++b) le[b] = static_cast<unsigned char>(u >> (8 * b));
    hasher.Update(le, sizeof(le));
  }
  CAPSULE_ASSIGN_OR_RETURN(std::string raw, hasher.Finish());
  return HexEncode(raw);
}

Status RedactCapsule(v1::Capsule* capsule, const RedactOptions& options) {
  if (capsule == nullptr) return InvalidArgumentError("no capsule to redact");
  if (!options.text && !options.tokens && !options.paths && !options.host) {
    return InvalidArgumentError("no item to drop; give some of " + JoinRedactItemNames(","));
  }
  if (!IsSha256Hex(options.source_sha256)) {
    return InvalidArgumentError("source_sha256 must be the source file's lowercase hex SHA-256");
  }
  // Fail closed: a field this reader does not know may hold anything, at any depth (a newer
  // writer's sample text, say). Drop them all, whatever was asked for, and record how much went.
  const size_t with_unknown = capsule->ByteSizeLong();
  capsule->DiscardUnknownFields();
  const uint64_t unknown_bytes = with_unknown - capsule->ByteSizeLong();
  // Text first: it reads the raw texts the other items do not touch, and must see the log lines
  // before paths and host rewrite them.
  if (options.text) RedactText(capsule);
  if (options.tokens) CAPSULE_RETURN_IF_ERROR(RedactTokens(capsule));
  if (options.paths) RedactPaths(capsule);
  if (options.host) RedactHost(capsule);

  v1::Redaction* r = capsule->mutable_redaction();
  std::set<std::string> dropped(r->dropped().begin(), r->dropped().end());
  const bool chosen[] = {options.text, options.tokens, options.paths, options.host};
  for (size_t i = 0; i < std::size(kRedactItemNames); ++i) {
    if (chosen[i]) dropped.insert(std::string(kRedactItemNames[i]));
  }
  r->clear_dropped();
  for (const std::string_view item : kRedactItemNames) {
    if (dropped.count(std::string(item)) > 0) r->add_dropped(std::string(item));
  }
  const int64_t now = options.now_unix_micros != 0
                          ? options.now_unix_micros
                          : std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  r->set_redacted_unix_micros(now);
  r->set_unknown_field_bytes_dropped(r->unknown_field_bytes_dropped() + unknown_bytes);
  r->set_source_sha256(options.source_sha256);
  return Status::Ok();
}

}  // namespace capsule
