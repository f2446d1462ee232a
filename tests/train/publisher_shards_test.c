/* The trainer-side C API with per-rank shards (dcr/publisher_c.h), compiled as C: a training
 * process whose parameters live as Megatron-like rank shards of the tiny preset (its own shard
 * bytes, stepped version by version; its own exporter, written here as a framework's converter
 * would be) hands each version as those shards to the sender of a long-lived run.
 *
 *   publisher_shards_test export LAYOUT OUT_DIR VERSIONS
 *     writes OUT_DIR/step<k>.safetensors, k = 0..VERSIONS: the exporter's canonical checkpoint
 *     of each version's shards (the dense targets the receivers hold and verify against).
 *   publisher_shards_test publish LAYOUT SCENARIO STATE_DIR WORK_DIR RECEIVERS SPEC...
 *     opens the sender of SCENARIO's rank 0 (dcr_publisher_open_scenario), checks the refusals
 *     of bad shards, attaches the shards of version 0 and publishes one version per SPEC:
 *     "shards" (dcr_publisher_publish_shards) or "file:PATH" (dcr_publisher_publish_file).
 *     Prints per version "version K: rc R, delta from version B, from_shards F, committed N".
 * Exit 0 when every check passed and RECEIVERS receivers committed every version. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcr/publisher_c.h"

#define MODEL "tiny"
/* The tiny preset's attention shape: a framework knows its model's config. */
#define HEADS 4
#define KV_HEADS 2
#define HEAD_DIM 64
#define MAX_STAGES 16

typedef struct Model {
  dcr_train_layout* l;
  int ranks, tp, pp;
  int stage_first[MAX_STAGES]; /* first global layer of each pipeline stage */
  int stage_layers[MAX_STAGES];
} Model;

typedef struct Shards {
  int n;
  dcr_shard* d;
  unsigned char** bytes;
} Shards;

static int Width(const char* dtype) { return strcmp(dtype, "F32") == 0 ? 4 : 2; }

static uint16_t ToBF16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Parameter `name` of rank `rank` and its bytes (NULL if absent). */
static const unsigned char* Param(const Model* m, const dcr_shard_reader* sh, int rank,
                                  const char* name, dcr_train_param* info) {
  long i = dcr_train_layout_find_param(m->l, rank, name);
  if (i < 0 || dcr_train_layout_param(m->l, rank, (size_t)i, info) != 0) return NULL;
  return (const unsigned char*)dcr_shard_read(sh, rank, info->buffer, info->offset, info->numel);
}

/* The framework's converter: rank shards -> one canonical Hugging Face tensor. */
static int Export(void* user, const dcr_shard_reader* sh, size_t t, void* out_v) {
  const Model* m = (const Model*)user;
  unsigned char* out = (unsigned char*)out_v;
  dcr_tensor spec;
  dcr_train_param info;
  const unsigned char* src;
  char pname[256];
  int stage = 0, local = 0, w, tp, part = 0;
  int64_t rows, cols, layer = -1;
  const char* suf = NULL;
  enum { kNorm, kRow, kVocab, kQkv, kFc1 } kind;
  if (dcr_train_layout_tensor(m->l, t, &spec) != 0) return 1;
  w = Width(spec.dtype);
  rows = spec.shape[0];
  cols = spec.ndim > 1 ? spec.shape[1] : 1;
  if (strncmp(spec.name, "model.layers.", 13) == 0) {
    char* end;
    int s;
    layer = strtoll(spec.name + 13, &end, 10);
    suf = end + 1;
    for (s = 0; s < m->pp; ++s) {
      if (layer >= m->stage_first[s] && layer < m->stage_first[s] + m->stage_layers[s]) break;
    }
    if (s == m->pp) return 8;
    stage = s;
    local = (int)(layer - m->stage_first[s]);
  }
  if (strcmp(spec.name, "model.embed_tokens.weight") == 0) {
    kind = kVocab;
    snprintf(pname, sizeof(pname), "embedding.word_embeddings.weight");
  } else if (strcmp(spec.name, "lm_head.weight") == 0) {
    kind = kVocab;
    stage = m->pp - 1;
    snprintf(pname, sizeof(pname), "output_layer.weight");
  } else if (strcmp(spec.name, "model.norm.weight") == 0) {
    kind = kNorm;
    stage = m->pp - 1;
    snprintf(pname, sizeof(pname), "decoder.final_layernorm.weight");
  } else if (suf == NULL) {
    return 7;
  } else if (strcmp(suf, "input_layernorm.weight") == 0) {
    kind = kNorm;
    snprintf(pname, sizeof(pname), "decoder.layers.%d.input_layernorm.weight", local);
  } else if (strcmp(suf, "post_attention_layernorm.weight") == 0) {
    kind = kNorm;
    snprintf(pname, sizeof(pname), "decoder.layers.%d.pre_mlp_layernorm.weight", local);
  } else if (strncmp(suf, "self_attn.", 10) == 0 && strcmp(suf + 11, "_proj.weight") == 0 &&
             (suf[10] == 'q' || suf[10] == 'k' || suf[10] == 'v')) {
    kind = kQkv;
    part = suf[10] == 'q' ? 0 : suf[10] == 'k' ? 1 : 2;
    snprintf(pname, sizeof(pname), "decoder.layers.%d.self_attention.linear_qkv.weight", local);
  } else if (strcmp(suf, "self_attn.o_proj.weight") == 0) {
    kind = kRow;
    snprintf(pname, sizeof(pname), "decoder.layers.%d.self_attention.linear_proj.weight", local);
  } else if (strcmp(suf, "mlp.gate_proj.weight") == 0 || strcmp(suf, "mlp.up_proj.weight") == 0) {
    kind = kFc1;
    part = suf[4] == 'u' ? 1 : 0;
    snprintf(pname, sizeof(pname), "decoder.layers.%d.mlp.linear_fc1.weight", local);
  } else if (strcmp(suf, "mlp.down_proj.weight") == 0) {
    kind = kRow;
    snprintf(pname, sizeof(pname), "decoder.layers.%d.mlp.linear_fc2.weight", local);
  } else {
    return 7;
  }
  for (tp = 0; tp < m->tp; ++tp) {
    const int rank = stage * m->tp + tp;
    dcr_train_buffer buf;
    int64_t i;
    src = Param(m, sh, rank, pname, &info);
    if (src == NULL || dcr_train_layout_buffer(m->l, rank, (size_t)info.buffer, &buf) != 0) {
      return 8;
    }
    switch (kind) {
      case kNorm: /* replicated: rank tp 0's copy; FP32 on ranks, stored as BF16 */
        if (Width(buf.dtype) == 4 && w == 2) {
          for (i = 0; i < rows; ++i) {
            uint32_t u;
            uint16_t b;
            memcpy(&u, src + 4 * i, 4);
            b = ToBF16(u);
            memcpy(out + 2 * i, &b, 2);
          }
        } else {
          memcpy(out, src, (size_t)(rows * w));
        }
        return 0;
      case kRow: { /* columns split over tp */
        const int64_t lc = cols / m->tp;
        for (i = 0; i < rows; ++i) {
          memcpy(out + (i * cols + tp * lc) * w, src + i * lc * w, (size_t)(lc * w));
        }
        break;
      }
      case kVocab: { /* rows split over tp, padded: the padding is dropped */
        const int64_t local_rows = (int64_t)info.numel / cols, first = tp * local_rows;
        const int64_t n = rows - first < local_rows ? rows - first : local_rows;
        if (n > 0) memcpy(out + first * cols * w, src, (size_t)(n * cols * w));
        break;
      }
      case kQkv: { /* [q heads of group g, k_g, v_g] per kv group, groups split over tp */
        const int64_t h = cols, d = HEAD_DIM, qpg = HEADS / KV_HEADS, groups = KV_HEADS / m->tp;
        const int64_t heads = part == 0 ? qpg : 1;
        int64_t g, hq;
        for (g = 0; g < groups; ++g) {
          const int64_t gg = tp * groups + g;
          for (hq = 0; hq < heads; ++hq) {
            const int64_t src_head = g * (qpg + 2) + (part == 0 ? hq : qpg + part - 1);
            const int64_t dst_head = part == 0 ? gg * qpg + hq : gg;
            memcpy(out + dst_head * d * h * w, src + src_head * d * h * w, (size_t)(d * h * w));
          }
        }
        break;
      }
      case kFc1: { /* [gate rows; up rows] per tp rank */
        const int64_t lr = rows / m->tp;
        memcpy(out + tp * lr * cols * w, src + part * lr * cols * w, (size_t)(lr * cols * w));
        break;
      }
    }
  }
  return 0;
}

static int OpenModel(Model* m, const char* layout) {
  int s, r;
  memset(m, 0, sizeof(*m));
  if (dcr_train_layout_open(MODEL, layout, &m->l) != 0) {
    fprintf(stderr, "layout: %s\n", dcr_train_layout_error(m->l));
    return -1;
  }
  m->ranks = dcr_train_layout_ranks(m->l);
  /* tp: ranks of stage 0 hold the embedding (ep = 1 for this dense model) */
  m->tp = 0;
  for (r = 0; r < m->ranks; ++r) {
    if (dcr_train_layout_find_param(m->l, r, "embedding.word_embeddings.weight") >= 0) ++m->tp;
  }
  m->pp = m->ranks / m->tp;
  for (s = 0; s < m->pp && s < MAX_STAGES; ++s) {
    char name[128];
    int n = 0;
    for (;;) {
      snprintf(name, sizeof(name), "decoder.layers.%d.input_layernorm.weight", n);
      if (dcr_train_layout_find_param(m->l, s * m->tp, name) < 0) break;
      ++n;
    }
    m->stage_layers[s] = n;
    m->stage_first[s] = s == 0 ? 0 : m->stage_first[s - 1] + m->stage_layers[s - 1];
  }
  return 0;
}

static uint64_t Next(uint64_t* x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 2685821657736338717ull;
}

/* Replicas (tensor-parallel copies of norms) get the bits of their tp-rank-0 copy, as an
 * all-reduced gradient gives them. */
static void SyncReplicas(const Model* m, Shards* sh) {
  int r;
  for (r = 0; r < m->ranks; ++r) {
    size_t i, np = dcr_train_layout_params(m->l, r);
    const int r0 = r - r % m->tp;
    if (r == r0) continue;
    for (i = 0; i < np; ++i) {
      dcr_train_param p, p0;
      dcr_train_buffer b;
      long k;
      dcr_train_layout_param(m->l, r, i, &p);
      if (!p.replica) continue;
      k = dcr_train_layout_find_param(m->l, r0, p.name);
      if (k < 0) continue;
      dcr_train_layout_param(m->l, r0, (size_t)k, &p0);
      dcr_train_layout_buffer(m->l, r, (size_t)p.buffer, &b);
      {
        const int w = Width(b.dtype);
        int a, c;
        for (a = 0; a < sh->n && !(sh->d[a].rank == r && sh->d[a].buffer == p.buffer); ++a) {
        }
        for (c = 0; c < sh->n && !(sh->d[c].rank == r0 && sh->d[c].buffer == p0.buffer); ++c) {
        }
        memcpy(sh->bytes[a] + p.offset * w, sh->bytes[c] + p0.offset * w, (size_t)(p.numel * w));
      }
    }
  }
}

/* Version 0's shards: BF16 weights of small magnitude, FP32 norms near 1. */
static void InitShards(const Model* m, Shards* sh) {
  int r, k = 0;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  sh->n = 0;
  for (r = 0; r < m->ranks; ++r) sh->n += (int)dcr_train_layout_buffers(m->l, r);
  sh->d = (dcr_shard*)calloc((size_t)sh->n, sizeof(dcr_shard));
  sh->bytes = (unsigned char**)calloc((size_t)sh->n, sizeof(unsigned char*));
  for (r = 0; r < m->ranks; ++r) {
    size_t b, nb = dcr_train_layout_buffers(m->l, r);
    for (b = 0; b < nb; ++b, ++k) {
      dcr_train_buffer info;
      uint64_t i;
      int w;
      dcr_train_layout_buffer(m->l, r, b, &info);
      w = Width(info.dtype);
      sh->bytes[k] = (unsigned char*)calloc((size_t)info.numel + 1, (size_t)w);
      for (i = 0; i < info.numel; ++i) {
        const double u = (double)(Next(&x) >> 11) / 9007199254740992.0 - 0.5;
        float f = w == 4 ? (float)(1.0 + 0.1 * u) : (float)(0.05 * u);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        if (w == 4) {
          memcpy(sh->bytes[k] + 4 * i, &bits, 4);
        } else {
          uint16_t h = ToBF16(bits);
          memcpy(sh->bytes[k] + 2 * i, &h, 2);
        }
      }
      sh->d[k].rank = r;
      sh->d[k].buffer = (int)b;
      sh->d[k].data = sh->bytes[k];
      sh->d[k].nbytes = info.numel * (uint64_t)w;
    }
  }
  SyncReplicas(m, sh);
}

/* One optimizer step of the trainer: about 3% of the elements move (a BF16 ulp up or down; an
 * FP32 norm by 0.2%, which its BF16 export sees now and then). */
static void StepShards(const Model* m, Shards* sh, int version) {
  int k;
  uint64_t x = 0x2545f4914f6cdd1dull + (uint64_t)version * 0x9e3779b97f4a7c15ull;
  for (k = 0; k < sh->n; ++k) {
    const uint64_t n = sh->d[k].nbytes;
    dcr_train_buffer info;
    uint64_t i;
    dcr_train_layout_buffer(m->l, sh->d[k].rank, (size_t)sh->d[k].buffer, &info);
    if (Width(info.dtype) == 4) {
      for (i = 0; i < n / 4; ++i) {
        if (Next(&x) % 100 < 3) {
          float f;
          memcpy(&f, sh->bytes[k] + 4 * i, 4);
          f *= (Next(&x) & 1) ? 1.002f : 0.998f;
          memcpy(sh->bytes[k] + 4 * i, &f, 4);
        }
      }
    } else {
      for (i = 0; i < n / 2; ++i) {
        if (Next(&x) % 100 < 3) {
          uint16_t h;
          memcpy(&h, sh->bytes[k] + 2 * i, 2);
          h = (uint16_t)(h + ((Next(&x) & 1) ? 1 : 0xffff));
          memcpy(sh->bytes[k] + 2 * i, &h, 2);
        }
      }
    }
  }
  SyncReplicas(m, sh);
}

static int Expect(const char* what, int rc, int want, const char* msg, const char* needle) {
  if (rc != want || strstr(msg, needle) == NULL) {
    fprintf(stderr, "FAIL %s: rc %d (want %d), '%s' (want '%s')\n", what, rc, want, msg, needle);
    return 1;
  }
  printf("ok   %s refused: %s\n", what, msg);
  return 0;
}

static int RunExport(const Model* m, const char* dir, int versions) {
  Shards sh;
  int v;
  InitShards(m, &sh);
  for (v = 0; v <= versions; ++v) {
    char path[4096];
    int rc;
    if (v > 0) StepShards(m, &sh, v);
    snprintf(path, sizeof(path), "%s/step%d.safetensors", dir, v);
    rc = dcr_train_layout_export(m->l, Export, (void*)m, sh.d, (size_t)sh.n, path);
    if (rc != 0) {
      fprintf(stderr, "export %s: %d %s\n", path, rc, dcr_train_layout_error(m->l));
      return 1;
    }
  }
  return 0;
}

static int RunPublish(const Model* m, int argc, char** argv) {
  const char* scenario = argv[3];
  const char* state = argv[4];
  const char* work = argv[5];
  const int receivers = atoi(argv[6]);
  dcr_publisher* p = NULL;
  Shards sh, later;
  int rc, i, failed = 0, committed = 0;
  rc = dcr_publisher_open_scenario(scenario, 0, NULL, state, work, &p);
  if (rc != 0) {
    fprintf(stderr, "open: %d %s\n", rc, dcr_publisher_error(p));
    dcr_publisher_close(p);
    return 3;
  }
  InitShards(m, &sh);
  InitShards(m, &later);
  StepShards(m, &later, 1);
  /* Bad input, each refused with a clear error before anything is sent (the call runs before
   * its message is read). */
#define EXPECT_REFUSED(what, call, want, needle)                       \
  do {                                                                 \
    const int rc_ = (call);                                            \
    failed |= Expect(what, rc_, want, dcr_publisher_error(p), needle); \
  } while (0)
  EXPECT_REFUSED("shards before attach", dcr_publisher_publish_shards(p, 1, sh.d, (size_t)sh.n), 4,
                 "no shards attached");
  EXPECT_REFUSED(
      "base shards of another version",
      dcr_publisher_attach_shards(p, m->l, Export, (void*)m, 0, later.d, (size_t)later.n), 4,
      "is not that of the base checkpoint");
  rc = dcr_publisher_attach_shards(p, m->l, Export, (void*)m, 0, sh.d, (size_t)sh.n);
  if (rc != 0) {
    fprintf(stderr, "attach: %d %s\n", rc, dcr_publisher_error(p));
    dcr_publisher_close(p);
    return 1;
  }
  EXPECT_REFUSED("a version out of order",
                 dcr_publisher_publish_shards(p, 7, later.d, (size_t)later.n), 1,
                 "the plan's next version is 1");
  EXPECT_REFUSED("a missing shard",
                 dcr_publisher_publish_shards(p, 1, later.d, (size_t)later.n - 1), 1,
                 "missing shard: rank");
  later.d[0].nbytes -= 2;
  EXPECT_REFUSED("a shard of the wrong size",
                 dcr_publisher_publish_shards(p, 1, later.d, (size_t)later.n), 1,
                 "bytes; the layout's buffer holds");
  later.d[0].nbytes += 2;
  later.d[1].rank = m->ranks;
  EXPECT_REFUSED("a rank outside the layout",
                 dcr_publisher_publish_shards(p, 1, later.d, (size_t)later.n), 1,
                 "outside the layout's");
  later.d[1].rank = later.d[0].rank;
  later.d[1].buffer = later.d[0].buffer;
  later.d[1].nbytes = later.d[0].nbytes;
  EXPECT_REFUSED("a shard given twice",
                 dcr_publisher_publish_shards(p, 1, later.d, (size_t)later.n), 1, "given twice");
#undef EXPECT_REFUSED
  for (i = 7; i < argc; ++i) {
    const uint64_t version = (uint64_t)(i - 6);
    uint64_t base = 0, hash[2];
    int from_shards = 0;
    StepShards(m, &sh, (int)version); /* the trainer steps every version */
    if (strcmp(argv[i], "shards") == 0) {
      rc = dcr_publisher_publish_shards(p, version, sh.d, (size_t)sh.n);
    } else if (strncmp(argv[i], "file:", 5) == 0) {
      rc = dcr_publisher_publish_file(p, version, argv[i] + 5);
    } else {
      return 2;
    }
    dcr_publisher_last(p, hash, &committed);
    dcr_publisher_last_delta(p, &base, &from_shards);
    printf("version %llu: rc %d, delta from version %llu, from_shards %d, committed %d%s%s\n",
           (unsigned long long)version, rc, (unsigned long long)base, from_shards, committed,
           rc ? ": " : "", rc ? dcr_publisher_error(p) : "");
    if (rc != 0 || committed != receivers) failed = 1;
  }
  rc = dcr_publisher_close(p);
  if (rc != 0) {
    fprintf(stderr, "close: %d\n", rc);
    failed = 1;
  }
  return failed;
}

int main(int argc, char** argv) {
  Model m;
  int rc;
  if (argc >= 5 && strcmp(argv[1], "export") == 0) {
    if (OpenModel(&m, argv[2]) != 0) return 1;
    rc = RunExport(&m, argv[3], atoi(argv[4]));
  } else if (argc >= 8 && strcmp(argv[1], "publish") == 0) {
    if (OpenModel(&m, argv[2]) != 0) return 1;
    rc = RunPublish(&m, argc, argv);
  } else {
    fprintf(stderr,
            "usage: %s export LAYOUT OUT_DIR VERSIONS | publish LAYOUT SCENARIO STATE "
            "WORK RECEIVERS SPEC...\n",
            argv[0]);
    return 2;
  }
  dcr_train_layout_close(m.l);
  return rc;
}
