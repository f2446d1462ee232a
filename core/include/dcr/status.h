// dcr::Status: the error value every dcr API returns.
//
// A Status is either OK (no allocation) or a code plus a message. No exception crosses a dcr API;
// bad input and device errors come back as a Status, never as an abort.
//
// Thread safety: a Status is a value; distinct objects may be used from distinct threads freely.
#ifndef DCR_CORE_INCLUDE_DCR_STATUS_H_
#define DCR_CORE_INCLUDE_DCR_STATUS_H_

#include <memory>
#include <ostream>
#include <string>
#include <string_view>

namespace dcr {

// Pinned numeric values: they appear in exit codes and JSON results.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // malformed input: bad flags, YAML, shapes, layouts
  kNotFound = 2,            // missing file, object, tensor
  kDataLoss = 3,            // corrupt or truncated delta / checkpoint bytes
  kFailedPrecondition = 4,  // base mismatch, wrong version, state not ready
  kUnavailable = 5,         // transport failure, dead peer
  kDeadlineExceeded = 6,    // a timeout
  kUnimplemented = 7,       // a feature not built (e.g. CUDA without a GPU)
  kInternal = 8,            // a broken internal invariant
  kResourceExhausted = 9,   // out of memory or disk
  kAborted = 10,            // cancelled, e.g. by fault injection or shutdown
};

// Returns "OK", "INVALID_ARGUMENT", ... for a code.
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string_view message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // "CODE: message", or "OK".
  std::string ToString() const;

  // Returns a copy with "context: " prepended to the message (no-op for OK).
  Status WithContext(std::string_view context) const;

  bool IsInvalidArgument() const { return code() == StatusCode::kInvalidArgument; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsDataLoss() const { return code() == StatusCode::kDataLoss; }
  bool IsFailedPrecondition() const { return code() == StatusCode::kFailedPrecondition; }
  bool IsUnavailable() const { return code() == StatusCode::kUnavailable; }
  bool IsDeadlineExceeded() const { return code() == StatusCode::kDeadlineExceeded; }
  bool IsUnimplemented() const { return code() == StatusCode::kUnimplemented; }

  // Ignores an error deliberately (best-effort cleanup paths).
  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

Status InvalidArgumentError(std::string_view message);
Status NotFoundError(std::string_view message);
Status DataLossError(std::string_view message);
Status FailedPreconditionError(std::string_view message);
Status UnavailableError(std::string_view message);
Status DeadlineExceededError(std::string_view message);
Status UnimplementedError(std::string_view message);
Status InternalError(std::string_view message);
Status ResourceExhaustedError(std::string_view message);
Status AbortedError(std::string_view message);
// errno-based error for a failed system call: "what: strerror(errno)".
Status ErrnoError(std::string_view what, int err);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_STATUS_H_
