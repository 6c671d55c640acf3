// Status and StatusOr<T>: errors as values.
//
// Every fallible capsule function returns a Status (or a StatusOr<T> carrying either a value or an
// error). Codes are the canonical ones (same numbering as absl::StatusCode / google.rpc.Code).
// Which code to use:
//   kDataLoss           the bytes are corrupt (checksum or digest mismatch, bad protobuf)
//   kOutOfRange         the file ends before the sizes it declares (truncated)
//   kUnimplemented      written by a newer format (major version, required flag)
//   kUnauthenticated    unsigned, bad signature, or a signer that is not trusted
//   kFailedPrecondition environment or hash mismatch (e.g. weights of another model)
//   kInvalidArgument    bad caller input, or bytes that are not a capsule at all
//   kResourceExhausted  over a configured limit (size caps, rate limits, disk full)
//   kNotFound           a file, key, model or layer that does not exist
//   kPermissionDenied   a private key readable by group/world, an unwritable directory
//   kInternal           a bug, or an exception caught at a library boundary
// Messages are short, lowercase, specific, and say what to do.
//
//   capsule::StatusOr<Bytes> bytes = capsule::ReadFileBytes(path);
//   if (!bytes.ok()) return bytes.status();
//   CAPSULE_ASSIGN_OR_RETURN(auto decoded, capsule::DecodeCapsule(*bytes, options));
//
// Thread safety: Status and StatusOr are values; const methods may be called concurrently.
#ifndef CAPSULE_BASE_STATUS_H_
#define CAPSULE_BASE_STATUS_H_

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace capsule {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "DATA_LOSS", "OK", ...: the spelling used in samples/golden/EXPECTED and in JSON output.
std::string_view StatusCodeName(StatusCode code);
// Inverse of StatusCodeName; nullopt for an unknown name.
std::optional<StatusCode> StatusCodeFromName(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "DATA_LOSS: capsule: corrupt payload (...)"; "OK" for ok.
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message" (keeps the code). No-op on OK.
  Status WithContext(std::string_view prefix) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status PermissionDeniedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status DataLossError(std::string message);
Status UnauthenticatedError(std::string message);
Status UnavailableError(std::string message);

// errno-based error for a failed system call on `path`: ENOENT -> kNotFound,
// EACCES/EPERM/EROFS -> kPermissionDenied, ENOSPC/EDQUOT/EFBIG -> kResourceExhausted, else
// kInternal.
Status ErrnoError(int err, std::string_view what, std::string_view path);

namespace internal {
// Prints "StatusOr has no value: <status>" to stderr and aborts: reading the value of an error is a
// bug in the caller, and continuing would read an empty optional.
[[noreturn]] void DieOfBadStatusOrAccess(const Status& status);
}  // namespace internal

// Either a value or a non-OK Status. value(), operator* and operator-> require ok(); on an error
// they abort with the status text (as absl::StatusOr does), never read an absent value.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit like absl
    assert(!status_.ok() && "StatusOr constructed from an OK status without a value");
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr given an OK status");
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr constructed from an OK status without a value");
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr given an OK status");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  const T& value() const& {
    EnsureValue();
    return *value_;
  }
  T& value() & {
    EnsureValue();
    return *value_;
  }
  T&& value() && {
    EnsureValue();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void EnsureValue() const {
    if (!value_.has_value()) internal::DieOfBadStatusOrAccess(status_);
  }

  Status status_;
  std::optional<T> value_;
};

namespace internal {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace capsule

#define CAPSULE_STATUS_CONCAT_INNER_(a, b) a##b
#define CAPSULE_STATUS_CONCAT_(a, b) CAPSULE_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status or StatusOr) is not OK.
#define CAPSULE_RETURN_IF_ERROR(expr)                                          \
  do {                                                                         \
    ::capsule::Status capsule_status_ = ::capsule::internal::AsStatus((expr)); \
    if (!capsule_status_.ok()) return capsule_status_;                         \
  } while (0)

// `CAPSULE_ASSIGN_OR_RETURN(auto x, F());` declares x from F()'s value or returns F()'s error.
#define CAPSULE_ASSIGN_OR_RETURN(lhs, rexpr) \
  CAPSULE_ASSIGN_OR_RETURN_IMPL_(CAPSULE_STATUS_CONCAT_(capsule_statusor_, __LINE__), lhs, rexpr)
#define CAPSULE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();        \
  lhs = std::move(*tmp)

#endif  // CAPSULE_BASE_STATUS_H_
