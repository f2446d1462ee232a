// dcr_collide: forges a checkpoint with exactly the additive content hash (dcr/hash.h) of a
// genuine one, by a generalized birthday attack (Wagner's k-tree) over the hash's two 64-bit
// lanes: the attack the collision-resistant commitment (dcr/commitment.h) exists to stop.
//
//   dcr_collide IN OUT [--tensor NAME] [--keep-unchanged TARGET] [--zero N]
//
// Zeroes N (default 65536) elements of one width-2 tensor of IN (the largest, or NAME), then
// picks new values for 256 other elements of it so that the sum of the 256 terms' changes
// cancels the zeroing's exactly, in both lanes: the k-tree over 256 lists of the 2^16 bit
// patterns of each element, zeroing 16 bits of the running sums per level (levels 1-4 the low
// lane, 5-7 the high lane, the root the last 16 bits). With --keep-unchanged, only elements
// that equal TARGET's are touched (an attacker who sees the delta poisons what it does not
// change, so no chunk's base-change hash sees it). Writes OUT (a single .safetensors file) and
// checks that its content hash is IN's. Exit 0 on success, 1 on failure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/hash.h"

namespace {

using dcr::Hash128;

constexpr int kLevels = 8;  // 2^8 = 256 lists
constexpr int kLists = 1 << kLevels;
constexpr uint32_t kCandidates = 1u << 16;

Hash128 Sub(Hash128 a, const Hash128& b) {
  dcr::HashSub(&a, b);
  return a;
}
Hash128 Add(Hash128 a, const Hash128& b) {
  dcr::HashAdd(&a, b);
  return a;
}

// The 16-bit window that level `level` (1..8) zeroes.
uint32_t Window(const Hash128& h, int level) {
  if (level <= 4) return static_cast<uint32_t>(h.lo >> (16 * (level - 1))) & 0xffff;
  return static_cast<uint32_t>(h.hi >> (16 * (level - 5))) & 0xffff;
}

// Index pairs (left, right) into the children's lists of every internal node, kept for
// backtracking: pairs[level][k] (a leaf's entry j is candidate j itself).
std::vector<std::vector<std::vector<uint32_t>>> pairs;
// Leaf lists are made on demand: the term change of list k's element for each bit pattern.
std::function<void(int, std::vector<Hash128>*)> make_leaf;

// Entries of `a` + `b` whose window at `level` is zero (both zero below it, so no carry enters).
void Merge(const std::vector<Hash128>& a, const std::vector<Hash128>& b, int level,
           std::vector<Hash128>* out, std::vector<uint32_t>* out_pairs) {
  std::vector<uint32_t> start(kCandidates + 1, 0);
  for (const Hash128& e : b) start[Window(e, level) + 1]++;
  for (uint32_t i = 0; i < kCandidates; ++i) start[i + 1] += start[i];
  std::vector<uint16_t> sorted(b.size());
  std::vector<uint32_t> fill(start.begin(), start.end() - 1);
  for (size_t j = 0; j < b.size(); ++j)
    sorted[fill[Window(b[j], level)]++] = static_cast<uint16_t>(j);
  out->clear();
  out_pairs->clear();
  for (size_t i = 0; i < a.size() && out->size() < kCandidates; ++i) {
    const uint32_t need = (0x10000 - Window(a[i], level)) & 0xffff;
    for (uint32_t k = start[need]; k < start[need + 1] && out->size() < kCandidates; ++k) {
      out->push_back(Add(a[i], b[sorted[k]]));
      out_pairs->push_back(static_cast<uint32_t>(i) << 16 | sorted[k]);
    }
  }
}

// The list of node k at `level`, depth first (at most two lists per level alive).
void Solve(int level, int k, std::vector<Hash128>* out) {
  if (level == 0) {
    make_leaf(k, out);
    return;
  }
  std::vector<Hash128> left, right;
  Solve(level - 1, 2 * k, &left);
  Solve(level - 1, 2 * k + 1, &right);
  Merge(left, right, level, out, &pairs[level][k]);
}

// Candidate chosen for each leaf list, from entry `idx` of node (level, k).
void Backtrack(int level, int k, uint32_t idx, std::vector<uint32_t>* choice) {
  if (level == 0) {
    (*choice)[k] = idx;
    return;
  }
  const uint32_t p = pairs[level][k][idx];
  Backtrack(level - 1, 2 * k, p >> 16, choice);
  Backtrack(level - 1, 2 * k + 1, p & 0xffff, choice);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr, "usage: dcr_collide IN OUT [--tensor NAME] [--keep-unchanged TARGET] [--zero N]\n");
    return 1;
  }
  const std::string in = argv[1], out = argv[2];
  std::string tensor_name, keep;
  uint64_t zero = 65536;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--tensor")
      tensor_name = argv[i + 1];
    else if (k == "--keep-unchanged")
      keep = argv[i + 1];
    else if (k == "--zero")
      zero = std::stoull(argv[i + 1]);
    else {
      std::fprintf(stderr, "dcr_collide: unknown option %s\n", k.c_str());
      return 1;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto ck = dcr::Checkpoint::Open(in);
  if (!ck.ok() || (*ck)->files().size() != 1) {
    std::fprintf(stderr, "dcr_collide: %s: not a single-file checkpoint\n", in.c_str());
    return 1;
  }
  std::unique_ptr<dcr::Checkpoint> target;
  if (!keep.empty()) {
    auto t = dcr::Checkpoint::Open(keep);
    if (!t.ok()) {
      std::fprintf(stderr, "dcr_collide: %s: %s\n", keep.c_str(), t.status().ToString().c_str());
      return 1;
    }
    target = std::move(*t);
  }
  const dcr::TensorInfo* victim = nullptr;
  for (const dcr::TensorInfo& t : (*ck)->tensors()) {
    if (t.width() != 2) continue;
    if (!tensor_name.empty() ? t.name == tensor_name
                             : (victim == nullptr || t.nbytes > victim->nbytes)) {
      victim = &t;
    }
  }
  if (victim == nullptr) {
    std::fprintf(stderr, "dcr_collide: no 2-byte tensor to poison\n");
    return 1;
  }
  const dcr::CheckpointFile& f = (*ck)->files()[0];
  std::vector<uint8_t> bytes(f.data, f.data + f.size);
  const uint64_t data_off = static_cast<uint64_t>((*ck)->data(*victim) - f.data);
  uint16_t* elems = reinterpret_cast<uint16_t*>(bytes.data() + data_off);
  const uint16_t* tgt = nullptr;
  if (target) {
    for (const dcr::TensorInfo& t : target->tensors()) {
      if (t.name == victim->name && t.nbytes == victim->nbytes) {
        tgt = reinterpret_cast<const uint16_t*>(target->data(t));
      }
    }
    if (tgt == nullptr) {
      std::fprintf(stderr, "dcr_collide: %s has no tensor %s of the same size\n", keep.c_str(),
                   victim->name.c_str());
      return 1;
    }
  }
  // Positions: the first `zero` eligible elements are zeroed, the next 256 adjusted.
  std::vector<uint64_t> zeroed, adjusted;
  for (uint64_t i = 0; i < victim->num_elements(); ++i) {
    if (tgt != nullptr && tgt[i] != elems[i]) continue;
    if (zeroed.size() < zero) {
      if (elems[i] != 0) zeroed.push_back(i);
    } else if (adjusted.size() < kLists) {
      adjusted.push_back(i);
    } else {
      break;
    }
  }
  if (adjusted.size() < kLists) {
    std::fprintf(stderr, "dcr_collide: tensor %s has too few eligible elements\n",
                 victim->name.c_str());
    return 1;
  }
  const uint64_t salt = dcr::TensorSalt(victim->name);
  Hash128 moved;  // what the zeroing adds to the content hash
  for (uint64_t i : zeroed) {
    moved = Add(moved, Sub(dcr::ElementTerm(salt, i, 0), dcr::ElementTerm(salt, i, elems[i])));
    elems[i] = 0;
  }
  // Leaf lists: the change of each adjusted element's term for every bit pattern; list 0 also
  // carries the zeroing, so the k-tree looks for a total change of zero.
  make_leaf = [&](int k, std::vector<Hash128>* list) {
    const uint64_t i = adjusted[k];
    const Hash128 old = dcr::ElementTerm(salt, i, elems[i]);
    list->resize(kCandidates);
    for (uint32_t v = 0; v < kCandidates; ++v) {
      Hash128 d = Sub(dcr::ElementTerm(salt, i, v), old);
      if (k == 0) d = Add(d, moved);
      (*list)[v] = d;
    }
  };
  pairs.assign(kLevels + 1, {});
  for (int level = 1; level <= kLevels; ++level) pairs[level].resize(kLists >> level);
  std::vector<Hash128> root;
  Solve(kLevels, 0, &root);
  if (root.empty() || root[0] != Hash128{}) {
    std::fprintf(stderr, "dcr_collide: no collision found (root list of %zu)\n", root.size());
    return 1;
  }
  std::vector<uint32_t> choice(kLists);
  Backtrack(kLevels, 0, 0, &choice);
  for (int k = 0; k < kLists; ++k) elems[adjusted[k]] = static_cast<uint16_t>(choice[k]);
  {
    std::ofstream o(out, std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    if (!o) {
      std::fprintf(stderr, "dcr_collide: cannot write %s\n", out.c_str());
      return 1;
    }
  }
  auto forged = dcr::Checkpoint::Open(out);
  if (!forged.ok()) {
    std::fprintf(stderr, "dcr_collide: %s: %s\n", out.c_str(), forged.status().ToString().c_str());
    return 1;
  }
  const Hash128 want = (*ck)->ContentHash(0), got = (*forged)->ContentHash(0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "dcr_collide: tensor %s: %zu weights zeroed, %d adjusted; content hash %s %s %s "
      "(%.2f s)\n",
      victim->name.c_str(), zeroed.size(), kLists, got.ToHex().c_str(),
      got == want ? "==" : "!=", want.ToHex().c_str(), secs);
  return got == want && std::memcmp(bytes.data(), f.data, f.size) != 0 ? 0 : 1;
}
