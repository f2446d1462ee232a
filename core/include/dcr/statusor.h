// dcr::StatusOr<T>: a T or the Status saying why there is none.
//
// Thread safety: a value type; no internal synchronisation.
#ifndef DCR_CORE_INCLUDE_DCR_STATUSOR_H_
#define DCR_CORE_INCLUDE_DCR_STATUSOR_H_

#include <cstdlib>
#include <optional>
#include <utility>

#include "dcr/status.h"

namespace dcr {

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // REQUIRES: !status.ok() (an OK status without a value becomes kInternal).
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(runtime/explicit)
    if (status_.ok()) status_ = InternalError("StatusOr constructed from OK status without value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT(runtime/explicit)
  template <typename U, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, StatusOr<T>>>>
  StatusOr(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT(runtime/explicit)

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // REQUIRES: ok().
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T& operator*() const& { return *value_; }
  T& operator*() & { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_STATUSOR_H_
