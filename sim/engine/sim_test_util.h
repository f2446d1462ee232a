// Test helper: runs a function that builds a SimGrid engine in a forked child (one engine per
// process) and returns the doubles it produced.
#ifndef DCR_SIM_ENGINE_SIM_TEST_UTIL_H_
#define DCR_SIM_ENGINE_SIM_TEST_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <vector>

namespace dcr::sim::internal {

// Returns the child's values, or an empty vector if it crashed or exited non-zero.
inline std::vector<double> InChild(const std::function<std::vector<double>()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::vector<double> v = fn();
    size_t bytes = v.size() * sizeof(double);
    ssize_t n = ::write(fds[1], v.data(), bytes);
    ::_exit(n == static_cast<ssize_t>(bytes) ? 0 : 3);
  }
  ::close(fds[1]);
  std::vector<double> out;
  double d;
  while (::read(fds[0], &d, sizeof(d)) == static_cast<ssize_t>(sizeof(d))) out.push_back(d);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return {};
  return out;
}

}  // namespace dcr::sim::internal

#endif  // DCR_SIM_ENGINE_SIM_TEST_UTIL_H_
