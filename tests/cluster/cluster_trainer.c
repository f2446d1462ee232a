/* The trainer of the cluster test: a C program against dcr/publisher_c.h, rank 0 of a
 * deployment, as a user's training loop would be written. It opens the sender from the
 * deployment's scenario with a state directory, asks which version comes next (1 on a first
 * start, the first unpublished one after a restart), and then, version after version, "trains"
 * (waits for its gate) and hands the new checkpoint. How many versions it publishes is decided
 * while it runs: it stops when told to (the gate "stop") or when the sender takes no more.
 *
 *   cluster_trainer SCENARIO STATE_DIR WORK_DIR CHECKPOINT_DIR GATE_DIR
 *     version k is CHECKPOINT_DIR/step<k>.safetensors, handed once GATE_DIR/<k> exists (the
 *     training step's end); GATE_DIR/stop ends the loop (the publisher is closed).
 * Prints "next version K" after the open and "version K: rc R, N receivers committed, S s" after
 * each version (S: seconds from the hand-over to the version being out). Exit 0 when every
 * version handed was published; 1 when one failed; 3 when the open failed. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dcr/publisher_c.h"

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int Exists(const char* path) { return access(path, F_OK) == 0; }

int main(int argc, char** argv) {
  dcr_publisher* p = NULL;
  uint64_t version = 0;
  int rc, committed = 0, failed = 0;
  char path[4096], gate[4096], stop[4096];
  if (argc != 6) {
    fprintf(stderr, "usage: %s SCENARIO STATE_DIR WORK_DIR CHECKPOINT_DIR GATE_DIR\n", argv[0]);
    return 2;
  }
  rc = dcr_publisher_open_scenario(argv[1], 0, NULL, argv[2], argv[3], &p);
  if (rc != 0) {
    fprintf(stderr, "open: %d %s\n", rc, dcr_publisher_error(p));
    dcr_publisher_close(p);
    return 3;
  }
  snprintf(stop, sizeof(stop), "%s/stop", argv[5]);
  while (dcr_publisher_next_version(p, &version) == 0) {
    double t0;
    printf("next version %llu\n", (unsigned long long)version);
    fflush(stdout);
    snprintf(gate, sizeof(gate), "%s/%llu", argv[5], (unsigned long long)version);
    while (!Exists(gate) && !Exists(stop)) usleep(20000); /* the training step */
    if (!Exists(gate)) break;
    snprintf(path, sizeof(path), "%s/step%llu.safetensors", argv[4], (unsigned long long)version);
    t0 = Now();
    rc = dcr_publisher_publish_file(p, version, path);
    dcr_publisher_last(p, NULL, &committed);
    printf("version %llu: rc %d, %d receivers committed, %.2f s%s%s\n", (unsigned long long)version,
           rc, committed, Now() - t0, rc ? ": " : "", rc ? dcr_publisher_error(p) : "");
    fflush(stdout);
    if (rc != 0) {
      failed = 1;
      break;
    }
  }
  printf("stopping before version %llu\n", (unsigned long long)version);
  fflush(stdout);
  /* Versions of the plan not handed are abandoned: the sender stops before them. */
  rc = dcr_publisher_close(p);
  if (rc != 0 && !failed) fprintf(stderr, "close: %d\n", rc);
  return failed;
}
