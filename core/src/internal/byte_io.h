// Little-endian byte writer and bounds-checked reader (internal).
#ifndef DCR_CORE_SRC_INTERNAL_BYTE_IO_H_
#define DCR_CORE_SRC_INTERNAL_BYTE_IO_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"

namespace dcr::internal {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I64(int64_t v) { Raw(&v, 8); }
  void H128(const Hash128& h) {
    U64(h.lo);
    U64(h.hi);
  }
  // LEB128: 7 bits a byte, least significant first, high bit set on every byte but the last.
  void Leb(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<uint8_t>(v) | 0x80);
      v >>= 7;
    }
    out_->push_back(static_cast<uint8_t>(v));
  }
  void Raw(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  size_t size() const { return out_->size(); }

 private:
  std::vector<uint8_t>* out_;  // little-endian host assumed (x86-64, aarch64)
};

// Reads fields; any read past the end sets failed() and yields zeros.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size), begin_(data) {}
  uint8_t U8() {
    uint8_t v = 0;
    Raw(&v, 1);
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    Raw(&v, 4);
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    Raw(&v, 8);
    return v;
  }
  int64_t I64() {
    int64_t v = 0;
    Raw(&v, 8);
    return v;
  }
  Hash128 H128() {
    Hash128 h;
    h.lo = U64();
    h.hi = U64();
    return h;
  }
  // A LEB128 u64; truncation or more than 64 bits sets failed() and yields 0.
  uint64_t Leb() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (failed_ || p_ == end_) break;
      const uint8_t b = *p_++;
      if (shift == 63 && b > 1) break;
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    failed_ = true;
    return 0;
  }
  bool Raw(void* dst, size_t n) {
    if (failed_ || static_cast<size_t>(end_ - p_) < n) {
      failed_ = true;
      std::memset(dst, 0, n);
      return false;
    }
    std::memcpy(dst, p_, n);
    p_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (failed_ || static_cast<size_t>(end_ - p_) < n) {
      failed_ = true;
      return false;
    }
    p_ += n;
    return true;
  }
  const uint8_t* pos() const { return p_; }
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  bool failed() const { return failed_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* begin_;
  bool failed_ = false;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_BYTE_IO_H_
