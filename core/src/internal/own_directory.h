// Internal: a directory whose contents a process trusts because only its user can change them
// (a node's state, a run's work dir, a deployment's keys).
//
// Thread safety: a free function; concurrent calls on one path race only as mkdir(2) does.
#ifndef DCR_CORE_SRC_INTERNAL_OWN_DIRECTORY_H_
#define DCR_CORE_SRC_INTERNAL_OWN_DIRECTORY_H_

#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr::internal {

// What other users may do in the directory.
enum class OthersMay {
  kRead,     // no group/other write (mode & 022 == 0): keys and work dirs others may list
  kNothing,  // no group/other read or write (mode & 066 == 0): state that is nobody else's
};

// Creates `dir` (mode 0700; its missing parents too when `make_parents`) when it does not exist,
// then requires it to be a directory, not a symlink, owned by the effective user, with the mode
// `others` allows. `what` names it in errors ("state directory", "model.work_dir", ...).
// Errors: kFailedPrecondition naming `what`, `dir`, its owner uid and mode and what is wrong
// ("not a directory (a symlink or another file)", "... not by this user (uid U)", "... lets
// other users write into it"); errno codes of mkdir/lstat.
Status CheckOwnDirectory(const std::string& dir, std::string_view what, OthersMay others,
                         bool make_parents = false);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_OWN_DIRECTORY_H_
