// Propagation macros for dcr::Status / dcr::StatusOr.
#ifndef DCR_CORE_INCLUDE_DCR_STATUS_MACROS_H_
#define DCR_CORE_INCLUDE_DCR_STATUS_MACROS_H_

#include <cstdio>
#include <cstdlib>

#include "dcr/status.h"
#include "dcr/statusor.h"

#define DCR_CONCAT_INNER_(a, b) a##b
#define DCR_CONCAT_(a, b) DCR_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define DCR_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::dcr::Status dcr_status_ = (expr);        \
    if (!dcr_status_.ok()) return dcr_status_; \
  } while (0)

// DCR_ASSIGN_OR_RETURN(auto x, Foo()); declares/assigns `lhs` or returns the error.
#define DCR_ASSIGN_OR_RETURN(lhs, expr) \
  DCR_ASSIGN_OR_RETURN_IMPL_(DCR_CONCAT_(dcr_statusor_, __LINE__), lhs, expr)
#define DCR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

// Internal invariants only (never for input validation): prints and aborts.
#define DCR_CHECK(cond)                                                                 \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: DCR_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#endif  // DCR_CORE_INCLUDE_DCR_STATUS_MACROS_H_
