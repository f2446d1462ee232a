// Internal: the temporary file behind every atomic write (checkpoints, deltas, applied outputs,
// store objects, results).
//
// AtomicFile creates a fresh temporary beside its destination with an unpredictable name
// (mkostemp: O_CREAT | O_EXCL, so a file or symlink planted at the name is never opened or
// followed), gives it the destination's permission bits when the destination is an existing
// regular file (else 0644 less the umask), and on Commit fsyncs it and renames it over the
// destination. Until Commit succeeds, destruction removes the temporary: an error leaves
// nothing behind. Not thread-safe; one writer per object.
#ifndef DCR_CORE_SRC_INTERNAL_ATOMIC_FILE_H_
#define DCR_CORE_SRC_INTERNAL_ATOMIC_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::internal {

class AtomicFile {
 public:
  // The temporary is "<path>.tmp.XXXXXX", or "<dir of path>/<tmp_name_prefix><base name>.XXXXXX"
  // when `tmp_name_prefix` is not empty. Errors: those of ErrnoError for the create (kNotFound
  // for a missing directory, kFailedPrecondition for EACCES / EROFS, ...).
  static StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path,
                                                      const std::string& tmp_name_prefix = "");
  ~AtomicFile();  // closes and removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  int fd() const { return fd_; }
  const std::string& tmp_path() const { return tmp_; }
  const std::string& path() const { return path_; }

  // Appends `size` bytes (retries short writes and EINTR). ENOSPC: kResourceExhausted.
  Status Write(const void* data, size_t size);
  // Writes `size` bytes at `offset`.
  Status PWrite(const void* data, size_t size, uint64_t offset);
  // Sizes the temporary to `size` bytes with its blocks allocated (posix_fallocate), so that a
  // full filesystem fails here with kResourceExhausted and not later, e.g. as SIGBUS on a
  // mapping of the file.
  Status Reserve(uint64_t size);
  // fsync, close and rename over path(). REQUIRES: not committed.
  Status Commit();

 private:
  AtomicFile(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_, tmp_;
  int fd_;
  bool committed_ = false;
};

// A directory that appears whole or not at all (a sharded checkpoint written by apply or by
// WriteShardedCheckpoint). Files are written into a fresh private directory beside the
// destination, "<parent>/.<name>.tmp.XXXXXX" (mkdtemp: unpredictable, created exclusively); Commit
// fsyncs the directory and moves it into place: with renameat2(RENAME_NOREPLACE) when the
// destination does not exist, or with renameat2(RENAME_EXCHANGE) when it is an existing directory
// that holds only checkpoint files (*.safetensors, *.safetensors.index.json), whose old contents
// are then removed. A destination holding anything else is refused (kFailedPrecondition, naming the
// file) before anything is written, so no other data is ever deleted. Until Commit succeeds,
// destruction removes the temporary directory and everything in it. Not thread-safe.
class AtomicDirectory {
 public:
  static StatusOr<std::unique_ptr<AtomicDirectory>> Create(const std::string& path);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }
  // Path of `name` (a plain file name) inside the temporary directory: where to write it.
  // Files written there must be complete (fsynced) before Commit.
  std::string FilePath(const std::string& name) const { return tmp_ + "/" + name; }
  // fsync the directory, move it into place, remove any replaced contents.
  Status Commit();

 private:
  AtomicDirectory(std::string path, std::string tmp, bool replace)
      : path_(std::move(path)), tmp_(std::move(tmp)), replace_(replace) {}
  std::string path_, tmp_;
  bool replace_;
  bool committed_ = false;
};

// Removes the regular files (and symlinks) directly inside `dir`, then `dir` itself. Best effort:
// errors are ignored (cleanup of a temporary).
void RemoveFlatDirectory(const std::string& dir);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_ATOMIC_FILE_H_
