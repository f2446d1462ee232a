#include "dcr/status.h"

#include <cerrno>
#include <cstring>

namespace dcr {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kAborted:
      return "ABORTED";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string_view message) {
  if (code != StatusCode::kOk) rep_ = std::make_unique<Rep>(Rep{code, std::string(message)});
}

Status::Status(const Status& other)
    : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(rep_->code));
  s += ": ";
  s += rep_->message;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  std::string m(context);
  m += ": ";
  m += rep_->message;
  return Status(rep_->code, m);
}

Status InvalidArgumentError(std::string_view m) { return Status(StatusCode::kInvalidArgument, m); }
Status NotFoundError(std::string_view m) { return Status(StatusCode::kNotFound, m); }
Status DataLossError(std::string_view m) { return Status(StatusCode::kDataLoss, m); }
Status FailedPreconditionError(std::string_view m) {
  return Status(StatusCode::kFailedPrecondition, m);
}
Status UnavailableError(std::string_view m) { return Status(StatusCode::kUnavailable, m); }
Status DeadlineExceededError(std::string_view m) {
  return Status(StatusCode::kDeadlineExceeded, m);
}
Status UnimplementedError(std::string_view m) { return Status(StatusCode::kUnimplemented, m); }
Status InternalError(std::string_view m) { return Status(StatusCode::kInternal, m); }
Status ResourceExhaustedError(std::string_view m) {
  return Status(StatusCode::kResourceExhausted, m);
}
Status AbortedError(std::string_view m) { return Status(StatusCode::kAborted, m); }

Status ErrnoError(std::string_view what, int err) {
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case ENOSPC:
    case ENOMEM:
    case EDQUOT:
      code = StatusCode::kResourceExhausted;
      break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ETIMEDOUT:
      code = StatusCode::kUnavailable;
      break;
    case EINVAL:
    case EISDIR:
    case ENOTDIR:
      code = StatusCode::kInvalidArgument;
      break;
    // The filesystem refuses (permissions, read-only mount, a symlink where none may be).
    case EACCES:
    case EPERM:
    case EROFS:
    case ELOOP:
    case ETXTBSY:
      code = StatusCode::kFailedPrecondition;
      break;
    default:
      break;
  }
  return Status(code, m);
}

}  // namespace dcr
