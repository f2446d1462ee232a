// MapReadOnly / MakeResident: a mapped file made resident has every page in memory.
// MemoryCgroupLimit: the limit of a memory cgroup the process is moved into.
#include "internal/mapped_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dcr::internal {
namespace {

// Pages of [data, data + size) that mincore reports resident.
size_t ResidentPages(const void* data, size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((size + page - 1) / page);
  if (mincore(const_cast<void*>(data), size, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(MakeResidentTest, EveryPageOfAFileMappingIsResident) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dcr_resident_" + std::to_string(getpid())))
          .string();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = 64 * page + 123;
  {
    std::vector<char> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7);
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
  }
  void* map = nullptr;
  uint64_t n = 0;
  ASSERT_TRUE(MapReadOnly(path, &map, &n).ok());
  ASSERT_EQ(n, size);
  // Drop the file's cached pages where the kernel lets us, so there is something to read back.
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    posix_fadvise(fileno(f), 0, 0, POSIX_FADV_DONTNEED);
    std::fclose(f);
  }
  ASSERT_TRUE(MakeResident(map, n, path).ok());
  EXPECT_EQ(ResidentPages(map, n), (size + page - 1) / page);
  // An inner range (unaligned start) works too, and the bytes are the file's.
  const uint8_t* p = static_cast<const uint8_t*>(map);
  EXPECT_TRUE(MakeResident(p + 100, 5 * page, path).ok());
  EXPECT_EQ(p[size - 1], static_cast<uint8_t>(static_cast<char>((size - 1) * 7)));
  munmap(map, n);
  std::filesystem::remove(path);
}

TEST(MakeResidentTest, EmptyRangeIsNothingToDo) {
  EXPECT_TRUE(MakeResident(nullptr, 0, "none").ok());
}

TEST(MakeResidentTest, UnmappedRangeIsAnErrorNamingIt) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, 4 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
#ifdef MADV_POPULATE_READ
  const bool populate = madvise(m, page, MADV_POPULATE_READ) == 0;
#else
  const bool populate = false;
#endif
  ASSERT_EQ(munmap(m, 4 * page), 0);
  // Without MADV_POPULATE_READ the fallback reads the pages: an unmapped range would fault.
  if (!populate) GTEST_SKIP() << "kernel without MADV_POPULATE_READ";
  Status s = MakeResident(m, 4 * page, "gone.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gone.safetensors"), std::string::npos) << s;
}

// A child moved into a fresh memory cgroup of 300 MiB (v1, or v2 when its memory controller is
// enabled for children of the root) reads that limit. Needs root and a writable hierarchy.
TEST(MemoryCgroupLimit, ReadsTheLimitOfTheProcesssCgroup) {
  const uint64_t want = uint64_t{300} << 20;
  const std::string name = "dcr-mapped-file-test-" + std::to_string(::getpid());
  std::string dir, limit_file;
  for (const auto& [root, file] :
       {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory", "memory.limit_in_bytes"},
        {"/sys/fs/cgroup", "memory.max"}}) {
    if (::mkdir((root + "/" + name).c_str(), 0755) != 0) continue;
    struct stat st;
    if (::stat((root + "/" + name + "/" + file).c_str(), &st) != 0) {  // not a memory cgroup
      ::rmdir((root + "/" + name).c_str());
      continue;
    }
    std::ofstream f(root + "/" + name + "/" + file);
    f << want;
    f.close();
    if (f) {
      dir = root + "/" + name;
      limit_file = file;
      break;
    }
    ::rmdir((root + "/" + name).c_str());
  }
  if (dir.empty()) GTEST_SKIP() << "no writable memory cgroup hierarchy (needs root)";
  pid_t pid = ::fork();
  if (pid == 0) {
    std::ofstream procs(dir + "/cgroup.procs");
    procs << ::getpid();
    procs.close();
    ::_exit(procs && MemoryCgroupLimit() == want ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::rmdir(dir.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child in " << dir << " (" << limit_file << " = " << want
      << ") did not read that limit";
}

}  // namespace
}  // namespace dcr::internal
