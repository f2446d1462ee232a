/* The trainer-side C API (dcr/publisher_c.h), compiled as C: a training process hands each
 * version of a long-lived run to the sender, the first as a checkpoint file, the next ones as
 * tensors in memory, while real dcr-node receivers apply them.
 *
 *   publisher_c_test PLAN0 WORK_DIR RECEIVERS VERSION_SPEC...
 *   publisher_c_test scenario:RANK:STATE_DIR:SCENARIO WORK_DIR RECEIVERS VERSION_SPEC...
 *     (dcr_publisher_open_scenario; exit 3 when the open fails, its message on stderr)
 *     VERSION_SPEC: "file:PATH" or "tensors:MANIFEST:FILE", one per version from the publisher's
 *     next version (dcr_publisher_next_version: 1, or after a resume the first one the state has
 *     not published), in order; or "sleep:SECONDS" (the trainer's compute between versions); or
 *     "pause", which prints "paused" and waits to be killed. A manifest lists "meta KEY VALUE" and
 * "tensor NAME DTYPE OFFSET NBYTES NDIM DIMS..." lines (OFFSET: of the tensor's bytes in FILE); the
 * tensors are read from FILE into memory and handed from there. After each version it prints the
 * version's line, then "kept after version K: baseline B, N files in the work dir"
 * (dcr_publisher_baseline; the version-* files in WORK_DIR). Exit 0 when every version was
 * published and at least RECEIVERS receivers reported committing each. */
#define _POSIX_C_SOURCE 200809L
#include "dcr/publisher_c.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TENSORS 4096
#define MAX_META 64

static int ReadAll(const char* path, unsigned char** data, long* size) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return -1;
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = (unsigned char*)malloc((size_t)*size + 1);
  if (*data == NULL || fread(*data, 1, (size_t)*size, f) != (size_t)*size) {
    fclose(f);
    return -1;
  }
  fclose(f);
  return 0;
}

/* Publishes one version from a manifest; returns the dcr status code (or -1 on a test error). */
static int PublishTensors(dcr_publisher* p, uint64_t version, const char* manifest,
                          const char* file) {
  static dcr_tensor tensors[MAX_TENSORS];
  static int64_t shapes[MAX_TENSORS][8];
  static char names[MAX_TENSORS][256], dtypes[MAX_TENSORS][16];
  static char meta_store[MAX_META][2][256];
  const char* meta[2 * MAX_META];
  size_t n = 0, n_meta = 0;
  unsigned char* bytes = NULL;
  long size = 0;
  char line[4096];
  int rc;
  FILE* m = fopen(manifest, "r");
  if (m == NULL || ReadAll(file, &bytes, &size) != 0) {
    fprintf(stderr, "cannot read %s or %s\n", manifest, file);
    return -1;
  }
  while (fgets(line, sizeof(line), m) != NULL) {
    if (strncmp(line, "meta ", 5) == 0 && n_meta < MAX_META) {
      if (sscanf(line + 5, "%255s %255s", meta_store[n_meta][0], meta_store[n_meta][1]) != 2)
        continue;
      meta[2 * n_meta] = meta_store[n_meta][0];
      meta[2 * n_meta + 1] = meta_store[n_meta][1];
      ++n_meta;
    } else if (strncmp(line, "tensor ", 7) == 0 && n < MAX_TENSORS) {
      unsigned long long off = 0, nb = 0;
      int ndim = 0, used = 0;
      char* q;
      size_t d;
      if (sscanf(line + 7, "%255s %15s %llu %llu %d%n", names[n], dtypes[n], &off, &nb, &ndim,
                 &used) != 5 ||
          ndim < 0 || ndim > 8 || off + nb > (unsigned long long)size) {
        fprintf(stderr, "bad manifest line: %s", line);
        return -1;
      }
      q = line + 7 + used;
      for (d = 0; d < (size_t)ndim; ++d) shapes[n][d] = strtoll(q, &q, 10);
      tensors[n].name = names[n];
      tensors[n].dtype = dtypes[n];
      tensors[n].shape = shapes[n];
      tensors[n].ndim = (size_t)ndim;
      tensors[n].data = bytes + off;
      tensors[n].nbytes = nb;
      ++n;
    }
  }
  fclose(m);
  rc = dcr_publisher_publish_tensors(p, version, tensors, n, meta, n_meta);
  free(bytes);
  return rc;
}

int main(int argc, char** argv) {
  dcr_publisher* p = NULL;
  int receivers, i, rc, committed = 0, failed = 0;
  uint64_t hash[2], version = 0, next = 0;
  char expect[64];
  if (argc < 5) {
    fprintf(stderr,
            "usage: %s PLAN0|scenario:RANK:STATE:SCENARIO WORK_DIR RECEIVERS VERSION_SPEC...\n",
            argv[0]);
    return 2;
  }
  receivers = atoi(argv[3]);
  if (strncmp(argv[1], "scenario:", 9) == 0) {
    /* scenario:RANK:STATE_DIR:PATH, the multi-host form without a plan file */
    char state[4096];
    int rank = 0, used = 0;
    if (sscanf(argv[1] + 9, "%d:%4095[^:]:%n", &rank, state, &used) != 2 || used == 0) return 2;
    rc = dcr_publisher_open_scenario(argv[1] + 9 + used, rank, NULL, state, argv[2], &p);
  } else {
    rc = dcr_publisher_open(argv[1], argv[2], &p);
  }
  if (rc != 0) {
    fprintf(stderr, "open: %d %s\n", rc, dcr_publisher_error(p));
    dcr_publisher_close(p);
    return 3;
  }
  rc = dcr_publisher_next_version(p, &version);
  if (rc != 0) {
    fprintf(stderr, "next version: %d %s\n", rc, dcr_publisher_error(p));
    dcr_publisher_close(p);
    return 1;
  }
  printf("next version %llu\n", (unsigned long long)version);
  fflush(stdout);
  /* A version out of order is refused with a message naming the next one; the session goes on. */
  snprintf(expect, sizeof(expect), "next version is %llu", (unsigned long long)version);
  rc = dcr_publisher_publish_file(p, 99, "/nonexistent");
  if (rc != 1 || strstr(dcr_publisher_error(p), expect) == NULL) {
    fprintf(stderr, "out-of-order version: rc %d '%s'\n", rc, dcr_publisher_error(p));
    failed = 1;
  }
  for (i = 4; i < argc; ++i) {
    if (strncmp(argv[i], "sleep:", 6) == 0) {
      sleep((unsigned)atoi(argv[i] + 6));
      continue;
    }
    if (strcmp(argv[i], "pause") == 0) {
      printf("paused\n");
      fflush(stdout);
      for (;;) pause();
    }
    if (strncmp(argv[i], "file:", 5) == 0) {
      rc = dcr_publisher_publish_file(p, version, argv[i] + 5);
    } else if (strncmp(argv[i], "tensors:", 8) == 0) {
      char manifest[4096];
      const char* colon = strchr(argv[i] + 8, ':');
      if (colon == NULL || (size_t)(colon - (argv[i] + 8)) >= sizeof(manifest)) return 2;
      memcpy(manifest, argv[i] + 8, (size_t)(colon - (argv[i] + 8)));
      manifest[colon - (argv[i] + 8)] = '\0';
      rc = PublishTensors(p, version, manifest, colon + 1);
    } else {
      return 2;
    }
    dcr_publisher_last(p, hash, &committed);
    printf("version %llu: rc %d, content hash %016llx%016llx, %d receivers committed%s%s\n",
           (unsigned long long)version, rc, (unsigned long long)hash[1],
           (unsigned long long)hash[0], committed, rc ? ": " : "",
           rc ? dcr_publisher_error(p) : "");
    fflush(stdout);
    if (rc != 0 || committed < receivers) failed = 1;
    {
      /* What the publisher keeps: its baseline and the checkpoints it wrote in WORK_DIR. */
      uint64_t baseline = 0;
      int files = 0;
      DIR* d = opendir(argv[2]);
      struct dirent* e;
      while (d != NULL && (e = readdir(d)) != NULL) files += strncmp(e->d_name, "version-", 8) == 0;
      if (d != NULL) closedir(d);
      dcr_publisher_baseline(p, &baseline);
      printf("kept after version %llu: baseline %llu, %d files in the work dir\n",
             (unsigned long long)version, (unsigned long long)baseline, files);
      fflush(stdout);
    }
    /* The next version moves on by one with each version published. */
    if (i + 1 < argc && (dcr_publisher_next_version(p, &next) != 0 || next != version + 1)) {
      fprintf(stderr, "next version after %llu: %llu (%s)\n", (unsigned long long)version,
              (unsigned long long)next, dcr_publisher_error(p));
      failed = 1;
    }
    ++version;
  }
  rc = dcr_publisher_close(p);
  if (rc != 0) {
    fprintf(stderr, "close: %d\n", rc);
    failed = 1;
  }
  return failed;
}
