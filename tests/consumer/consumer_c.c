/* A C program built against an installed dcr (pkg-config --cflags --libs dcr), never against the
 * source tree: the trainer side of a one-version refit through the publisher C API.
 *
 *   consumer_c SCENARIO WORK_DIR TARGET
 *
 * Opens the sender of rank 0 of the multi-host scenario (dcr_publisher_open_scenario), hands
 * TARGET as version 1 and waits until it is out. Exit 0 when the library's C ABI is the one this
 * program was compiled against and every receiver of the scenario reported committing version 1;
 * prints the version's content hash. */
#include <dcr/dcr_c.h>
#include <dcr/publisher_c.h>
#include <stdint.h>
#include <stdio.h>

int main(int argc, char** argv) {
  dcr_publisher* p = NULL;
  uint64_t hash[2] = {0, 0};
  int committed = -1, rc;
  if (argc != 4) {
    fprintf(stderr, "usage: %s SCENARIO WORK_DIR TARGET\n", argv[0]);
    return 2;
  }
  if (dcr_c_abi_version() != DCR_C_ABI_VERSION) {
    fprintf(stderr, "libdcr has C ABI %d, this program was built for %d\n", dcr_c_abi_version(),
            DCR_C_ABI_VERSION);
    return 1;
  }
  rc = dcr_publisher_open_scenario(argv[1], 0, NULL, NULL, argv[2], &p);
  if (rc != DCR_OK) {
    fprintf(stderr, "open: %d %s\n", rc, p != NULL ? dcr_publisher_error(p) : "");
    dcr_publisher_close(p);
    return 1;
  }
  rc = dcr_publisher_publish_file(p, 1, argv[3]);
  if (rc != DCR_OK) fprintf(stderr, "publish: %d %s\n", rc, dcr_publisher_error(p));
  if (rc == DCR_OK) rc = dcr_publisher_last(p, hash, &committed);
  if (dcr_publisher_close(p) != DCR_OK && rc == DCR_OK) rc = DCR_INTERNAL;
  printf("version 1: rc %d, content hash %016llx%016llx, %d receivers committed\n", rc,
         (unsigned long long)hash[1], (unsigned long long)hash[0], committed);
  return rc == DCR_OK && committed >= 1 ? 0 : 1;
}
