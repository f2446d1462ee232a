// dcr verify A B: byte comparison of two files, naming the first difference.
#include <cerrno>
#include <cstdio>
#include <vector>

#include "command.h"
#include "dcr/checkpoint.h"

namespace dcr::cli {
namespace {

// Names the tensor holding byte `off` of a safetensors file, if it parses.
std::string Locate(const Checkpoint* ck, uint64_t off) {
  if (ck == nullptr) return "";
  uint64_t ds = ck->data_section_offset();
  if (off < ds) return " (in the safetensors header)";
  for (const auto& t : ck->tensors()) {
    if (off >= ds + t.offset && off < ds + t.offset + t.nbytes) {
      uint64_t e = (off - ds - t.offset) / static_cast<uint64_t>(t.width());
      return " (tensor '" + t.name + "', element " + std::to_string(e) + ")";
    }
  }
  return "";
}

}  // namespace

DCR_REGISTER_COMMAND("verify", "Compare two files byte for byte; exit 1 and name the first difference",
                     [](CLI::App* app) {
                       auto a = std::make_shared<std::pair<std::string, std::string>>();
                       app->add_option("a", a->first, "First file")->required();
                       app->add_option("b", a->second, "Second file")->required();
                       return [a]() {
                         auto ca = Checkpoint::Open(a->first);
                         // Compare raw bytes in blocks; parse only to name tensors.
                         FILE* fa = std::fopen(a->first.c_str(), "rb");
                         if (!fa) return ReportStatus("verify", ErrnoError("open " + a->first, errno));
                         FILE* fb = std::fopen(a->second.c_str(), "rb");
                         if (!fb) {
                           std::fclose(fa);
                           return ReportStatus("verify", ErrnoError("open " + a->second, errno));
                         }
                         std::vector<uint8_t> x(1 << 20), y(1 << 20);
                         uint64_t off = 0;
                         int rc = -1;
                         while (rc < 0) {
                           size_t nx = std::fread(x.data(), 1, x.size(), fa);
                           size_t ny = std::fread(y.data(), 1, y.size(), fb);
                           size_t n = std::min(nx, ny);
                           for (size_t i = 0; i < n; ++i) {
                             if (x[i] != y[i]) {
                               std::printf("DIFFER at byte %llu%s: %02x vs %02x\n",
                                           static_cast<unsigned long long>(off + i),
                                           Locate(ca.ok() ? ca->get() : nullptr, off + i).c_str(), x[i], y[i]);
                               rc = 1;
                               break;
                             }
                           }
                           if (rc >= 0) break;
                           off += n;
                           if (nx != ny) {
                             std::printf("DIFFER in size: one file ends at byte %llu\n",
                                         static_cast<unsigned long long>(off));
                             rc = 1;
                           } else if (nx == 0) {
                             rc = 0;
                           }
                         }
                         std::fclose(fa);
                         std::fclose(fb);
                         if (rc != 0) return rc;
                         std::printf("IDENTICAL: %llu bytes\n", static_cast<unsigned long long>(off));
                         return 0;
                       };
                     });

}  // namespace dcr::cli
