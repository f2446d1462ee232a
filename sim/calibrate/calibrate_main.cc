// dcr_sim_calibrate [-o FILE]: measures memcpy, encode and decode+apply bandwidth of the real codec
// on one core of this machine and writes the simulator's calibration JSON (the schema of
// `dcr bench codec --json`: memcpy_bytes_per_s, rates[{change_rate, encode_bytes_per_s,
// decode_apply_bytes_per_s}]). Data: 2^24 BF16 elements ~N(0, 0.02); at each rate a random subset
// of elements moves by +-1..3 ulp (the shape AdamW steps produce, shared/notes/codec.md).
// Encode = scan base vs target + EncodeChunk per 2^22-element cell (the target-range hash is
// additive and maintained from the changes, so it is not timed);
// decode+apply = DecodeChunk + ApplyValue in place. Best of 5 runs each.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/model.h"

namespace {

uint64_t g_state = 0x1234567;
uint64_t Next() {
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
double Uniform() { return ((Next() >> 11) + 0.5) / 9007199254740992.0; }
float Normal() {
  double u1 = Uniform(), u2 = Uniform();
  return static_cast<float>(std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
}

template <typename F>
double Best(F f, int reps = 5) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                              .count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "-";
  if (argc == 3 && std::string(argv[1]) == "-o") out = argv[2];
  const uint64_t n = uint64_t{1} << 24, cell = uint64_t{1} << 22;
  const double dense = static_cast<double>(n) * 2;
  std::vector<uint16_t> base(n), target(n), work(n);
  for (uint64_t i = 0; i < n; ++i) base[i] = dcr::FloatToBF16(0.02f * Normal());
  double memcpy_s = Best([&] { std::memcpy(work.data(), base.data(), n * 2); });
  nlohmann::json j;
  j["tool"] = "dcr_sim_calibrate (sim/calibrate/calibrate_main.cc)";
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  j["host"] = host;
  j["cores"] = 1;
  j["elements"] = n;
  j["memcpy_bytes_per_s"] = dense / memcpy_s;
  j["rates"] = nlohmann::json::array();
  const uint64_t salt = dcr::TensorSalt("calibration");
  for (double rate : {0.01, 0.03, 0.05}) {
    target = base;
    for (uint64_t i = 0; i < n; ++i) {
      if (Uniform() < rate) {
        int d = 1 + static_cast<int>(Next() % 3);
        target[i] = static_cast<uint16_t>(target[i] + ((Next() & 1) ? d : -d));
      }
    }
    // Target-range hashes are additive (hash.h): the training side updates them from the changes
    // alone, so they are computed here outside the timed encode.
    std::vector<dcr::Hash128> range_hash;
    for (uint64_t c = 0; c < n / cell; ++c) {
      range_hash.push_back(dcr::RangeHash(salt, reinterpret_cast<const uint8_t*>(target.data()), 2,
                                          c * cell, cell));
    }
    std::vector<std::vector<uint8_t>> records;
    dcr::ValueMode mode = dcr::ChooseValueMode(dcr::ValuePolicy::kAuto, dcr::DType::kBF16);
    auto encode = [&] {
      records.clear();
      for (uint64_t c = 0; c < n / cell; ++c) {
        dcr::ChunkChanges ch;
        ch.chunk_id = c;
        ch.width = 2;
        ch.segments = {dcr::Segment::Range(0, c * cell, cell)};
        ch.num_elements = cell;
        const uint16_t* b = base.data() + c * cell;
        const uint16_t* t = target.data() + c * cell;
        for (uint64_t i = 0; i < cell; ++i) {
          if (b[i] != t[i]) {
            ch.positions.push_back(i);
            ch.old_bits.push_back(b[i]);
            ch.new_bits.push_back(t[i]);
          }
        }
        ch.target_range_hash = range_hash[c];
        auto rec = dcr::EncodeChunk(ch, mode, {salt}, 1);
        if (!rec.ok()) {
          std::fprintf(stderr, "encode: %s\n", rec.status().ToString().c_str());
          std::exit(1);
        }
        records.push_back(std::move(*rec));
      }
    };
    double enc_s = Best(encode);
    double bytes = 0;
    for (const auto& r : records) bytes += static_cast<double>(r.size());
    auto apply = [&] {
      for (uint64_t c = 0; c < n / cell; ++c) {
        auto d = dcr::DecodeChunk(records[c].data(), records[c].size());
        if (!d.ok()) {
          std::fprintf(stderr, "decode: %s\n", d.status().ToString().c_str());
          std::exit(1);
        }
        uint16_t* w = work.data() + c * cell;
        for (size_t k = 0; k < d->positions.size(); ++k) {
          uint64_t p = d->positions[k];
          w[p] = static_cast<uint16_t>(dcr::ApplyValue(d->header.value_mode, 2, w[p], d->values[k]));
        }
      }
    };
    double app_s = Best([&] {
      std::memcpy(work.data(), base.data(), n * 2);  // timed separately below, subtracted
      apply();
    });
    app_s = std::max(app_s - memcpy_s, 1e-9);
    if (std::memcmp(work.data(), target.data(), n * 2) != 0) {
      std::fprintf(stderr, "calibration: decode+apply is not bit-exact at rate %g\n", rate);
      return 1;
    }
    j["rates"].push_back({{"change_rate", rate},
                          {"encode_bytes_per_s", dense / enc_s},
                          {"decode_apply_bytes_per_s", dense / app_s},
                          {"size_ratio", dense / bytes}});
  }
  std::string text = j.dump(2) + "\n";
  if (out == "-") {
    std::fputs(text.c_str(), stdout);
  } else {
    std::string tmp = out + ".tmp";
    std::ofstream(tmp) << text;
    std::rename(tmp.c_str(), out.c_str());
  }
  return 0;
}
