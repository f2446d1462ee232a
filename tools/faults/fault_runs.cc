// The faults block of `dcr run` (see fault_runs.h).
#include "fault_runs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "dcr/status_macros.h"
#include "run_faults.h"
#include "run_proxy_faults.h"
#include "run_s3_faults.h"

namespace dcr::cli {

Status RunScenarioFaultBlock(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                             const std::string& work_dir, int* run_index, ScenarioResult* out) {
  if (s.faults.runs > 0 && s.faults.per_run > 0) {
    DCR_RETURN_IF_ERROR(RunScenarioFaults(s, rate, ckpts, work_dir, out));
  }
  if (s.faults.process_runs > 0) {
    DCR_RETURN_IF_ERROR(RunScenarioProcessFaults(s, rate, ckpts, work_dir, run_index, out));
  }
  if (s.faults.proxy_runs > 0) {
    DCR_RETURN_IF_ERROR(RunScenarioProxyFaults(s, rate, ckpts, work_dir, run_index, out));
  }
  if (s.faults.s3_runs > 0) {
    DCR_RETURN_IF_ERROR(RunScenarioS3Faults(s, rate, ckpts, work_dir, run_index, out));
  }
  return Status();
}

StatusOr<pid_t> SpawnSubcommand(const char* subcommand, const std::string& spec_path,
                                const std::string& log) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return ErrnoError("readlink /proc/self/exe", errno);
  exe[n] = '\0';
  pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execl(exe, exe, subcommand, "--spec", spec_path.c_str(), (char*)nullptr);
    _exit(127);
  }
  return pid;
}

}  // namespace dcr::cli
