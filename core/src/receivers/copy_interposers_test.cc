// The interposed copy functions for this test binary (dcr/copy_interposers.h is included in exactly
// one translation unit), and tests of the hook itself.
#include "dcr/copy_interposers.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dcr/dcr_c.h"

namespace {

struct Seen {
  std::vector<std::pair<void*, size_t>> calls;
  int fills = 0;
};

void Observe(void* ctx, void* dst, const void*, size_t n, int kind) {
  auto* s = static_cast<Seen*>(ctx);
  s->calls.emplace_back(dst, n);
  if (kind == DCR_COPY_FILL) ++s->fills;
}

// A copy whose size the compiler cannot see.
__attribute__((noinline)) void CopyOpaque(void* d, const void* s, size_t n) {
  std::memcpy(d, s, n);
}

TEST(CopyHookTest, SeesMemcpyAndMemsetOnlyWhileInstalled) {
  std::vector<char> a(1000, 1), b(1000, 2);
  Seen seen;
  ASSERT_EQ(dcr_copy_hook_install(&Observe, &seen), DCR_OK);
  EXPECT_EQ(dcr_copy_hook_install(&Observe, &seen), DCR_FAILED_PRECONDITION);
  CopyOpaque(b.data(), a.data(), 777);
  std::memset(a.data(), 7, a.size());
  dcr_copy_hook_remove();
  CopyOpaque(b.data(), a.data(), 5);
  bool saw_copy = false;
  for (const auto& c : seen.calls) saw_copy |= c.first == b.data() && c.second == 777;
  EXPECT_TRUE(saw_copy);
  EXPECT_GE(seen.fills, 1);
  for (const auto& c : seen.calls) EXPECT_NE(c.second, 5u);
  EXPECT_EQ(b[0], 7);
  EXPECT_FALSE(dcr_copy_hook_active());
}

}  // namespace
