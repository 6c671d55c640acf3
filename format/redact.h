// Redaction: removing private data from a capsule before it is shared (`capsule redact`).
//
// RedactCapsule is a pure transformation of the message; the caller re-encodes and re-signs the
// result (the source signature cannot cover changed bytes). What each item drops:
//   text    every Sequence.raw_text, and log lines, the log error, backtrace lines and the trigger
//           message that contain a piece of that text (raw text leaks into logs through printed
//           samples; a line is dropped whole rather than edited, so no partial sample survives);
//   tokens  Sequence.token_ids become token_ids_sha256 + token_count, Sequence.labels are cleared
//           (shifted tokens), and the tensors that hold token ids are removed: the BATCH_INPUT
//           tensors input_ids and labels, and the LAYER_INPUTs of the first layer and any integer
//           LAYER_INPUT. The step can no longer be re-run (replay says so);
//   paths   FileIdentity.path becomes the file's base name, and the full paths and their
//           directories are replaced by "<redacted>" in log lines, error, backtrace, trigger
//           message and config_text;
//   host    Environment.hostname is cleared.
// Whatever the items, every field the schema does not define (unknown fields, at any depth) is
// dropped as well: a redactor cannot tell whether a field it cannot read is private.
// Capsule.redaction records the union of the items dropped so far, the time, the SHA-256 of the
// source file and the bytes of unknown fields dropped. Redacting twice with the same items gives
// the same content (except that record).
//
//   capsule::RedactOptions options;
//   options.text = options.tokens = true;
//   options.source_sha256 = *capsule::Sha256Hex(file_bytes);   // or CAPSULE_ASSIGN_OR_RETURN
//   CAPSULE_RETURN_IF_ERROR(capsule::RedactCapsule(&capsule_msg, options));
//
// Thread safety: thread-safe; the message must not be shared while it is redacted.
#ifndef CAPSULE_FORMAT_REDACT_H_
#define CAPSULE_FORMAT_REDACT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "capsule/base/status.h"
#include "capsule/format/capsule_fwd.h"

namespace capsule {

struct RedactOptions {
  // The items to drop (see above). At least one must be set (kInvalidArgument otherwise).
  bool text = false;
  bool tokens = false;
  bool paths = false;
  bool host = false;
  // SHA-256 (lowercase hex) of the source capsule file's bytes; recorded in
  // redaction.source_sha256. Required: a redacted capsule must name what it was made from
  // (kInvalidArgument when not hex).
  std::string source_sha256;
  // Recorded as redaction.redacted_unix_micros; 0 means the current time.
  int64_t now_unix_micros = 0;
};

// The items, in the order Capsule.redaction.dropped records them: the one list the parser, its
// messages and the command line's help use.
inline constexpr std::string_view kRedactItemNames[] = {"text", "tokens", "paths", "host"};

// Which of the items a list names.
struct RedactItems {
  bool text = false;
  bool tokens = false;
  bool paths = false;
  bool host = false;
};

// Parses a comma-separated list of item names (any subset, any order; "" names none).
// kInvalidArgument naming the item when one is unknown or empty ("text,,host").
StatusOr<RedactItems> ParseRedactItemList(std::string_view list);

// The item names joined by `separator`: "text,tokens,paths,host".
std::string JoinRedactItemNames(std::string_view separator);

// Parses "text,tokens,paths,host" (any non-empty subset, any order) into `options`' items.
// kInvalidArgument naming the unknown item otherwise.
Status ParseRedactItems(std::string_view list, RedactOptions* options);

// Lowercase hex SHA-256 of the ids as little-endian int64s: Sequence.token_ids_sha256.
// kInternal when SHA-256 cannot be computed (base/internal/sha256.h).
StatusOr<std::string> TokenIdsSha256(const std::vector<int64_t>& ids);

Status RedactCapsule(v1::Capsule* capsule, const RedactOptions& options);

}  // namespace capsule

#endif  // CAPSULE_FORMAT_REDACT_H_
