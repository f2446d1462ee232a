// libdcr: every product library of dcr in one shared object (see core/CMakeLists.txt, dcr_shared).
// Programs in other languages load it (the Python package, through ctypes) and the installed tree
// ships it. This file gives the shared object its one symbol of its own: the C ABI it was built
// with, so a loader can refuse a library of another ABI before it calls anything else.
#include "dcr/dcr_c.h"

extern "C" int dcr_c_abi_version(void) { return DCR_C_ABI_VERSION; }
