// Fixtures of the device test binaries, which run one suite on one backend. Header-only; include it
// from test files only (it uses GoogleTest).
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_DEVICE_FIXTURES_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_DEVICE_FIXTURES_H_

#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "dcr/device.h"

namespace dcr::testing {

// The backend under test: CUDA in a binary compiled with DCR_TEST_DEVICE_KIND=2, the host backend
// otherwise.
#if defined(DCR_TEST_DEVICE_KIND) && DCR_TEST_DEVICE_KIND == 2
inline constexpr DeviceKind kTestDeviceKind = DeviceKind::kCuda;
#else
inline constexpr DeviceKind kTestDeviceKind = DeviceKind::kHost;
#endif

}  // namespace dcr::testing

// Declares std::shared_ptr<Device> `var`, the backend under test opened, or skips the test naming
// why it cannot be opened.
#define DCR_OPEN_TEST_DEVICE_OR_SKIP(var)                             \
  std::shared_ptr<::dcr::Device> var;                                 \
  {                                                                   \
    auto opened = ::dcr::OpenDevice(::dcr::testing::kTestDeviceKind); \
    if (!opened.ok()) GTEST_SKIP() << opened.status();                \
    var = std::shared_ptr<::dcr::Device>(std::move(opened).value());  \
  }

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_DEVICE_FIXTURES_H_
