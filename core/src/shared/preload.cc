// libdcr_preload.so: dcr's copy interposers (dcr/copy_interposers.h) as a shared object preloaded
// ahead of libc (LD_PRELOAD), for runtimes whose executable cannot include the header: a Python
// serving process records its loader's copies (dcr.runtime.Recorder) when started with it.
// Its memcpy family forwards to libc's and reports to the copy hook of the libdcr.so it links.
#include "dcr/copy_interposers.h"
