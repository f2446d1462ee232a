// The --device / --device-index options of the commands that build deltas (diff, train-delta).
#ifndef DCR_CORE_CLI_DEVICE_OPTION_H_
#define DCR_CORE_CLI_DEVICE_OPTION_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "dcr/device.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"

namespace dcr::cli {

struct DeviceOption {
  std::string name = "cpu";
  int index = 0;

  // Adds --device cpu|host|cuda and --device-index N to `app`.
  void AddTo(CLI::App* app) {
    app->add_option("--device", name,
                    "Where changes are found: cpu (host scan), host (the device path on the host "
                    "backend) or cuda (the GPU); never changes the bytes")
        ->check(CLI::IsMember({"cpu", "host", "cuda"}))
        ->capture_default_str();
    app->add_option("--device-index", index, "Device ordinal with --device cuda")
        ->capture_default_str();
  }

  // The device to build on: null for cpu. kUnavailable naming CUDA and the reason when cuda has
  // no usable device (OpenDevice).
  StatusOr<std::unique_ptr<Device>> Open() const {
    DCR_ASSIGN_OR_RETURN(DeviceKind kind, ParseDeviceKind(name));
    if (kind == DeviceKind::kCpu) return std::unique_ptr<Device>();
    return OpenDevice(kind, index);
  }
};

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_DEVICE_OPTION_H_
