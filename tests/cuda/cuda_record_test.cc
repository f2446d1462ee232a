// Recording a load into device memory through the interposed cudaMemcpy / cudaMemcpy2D, then
// refitting the device buffers with the PlacementApplier. This translation unit includes
// dcr/cuda_copy_interposers.h and therefore must not include cuda_runtime_api.h: the few runtime
// functions it needs are declared with plain types (ABI-identical).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dcr/cuda_apply.h"
#include "dcr/cuda_copy_interposers.h"
#include "dcr/delta.h"
#include "dcr/testing/synth_pair.h"
#include "dcr/testing/test_model.h"
#include "receivers/recorder.h"

extern "C" int cudaMalloc(void** p, size_t n);
extern "C" int cudaFree(void* p);

namespace dcr {
namespace {

TEST(CudaRecordTest, CudaMemcpy2DTransposeIsRecordedAndRefitted) {
  if (!cuda::DeviceAvailable()) GTEST_SKIP() << cuda::DeviceDescription();
  ModelConfig m;
  m.vocab = 256;
  m.hidden = 64;
  m.layers = 1;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.intermediate = 128;
  auto [v0, v1] = testing::SyntheticCheckpointPair(m, 8, 0.05, 9, true);
  // A device "runtime": every 2-D weight stored transposed with element-wide cudaMemcpy2D column
  // copies, 1-D weights copied with cudaMemcpy.
  internal::CopyRecorder rec(*v0);
  std::vector<void*> bufs;
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : v0->tensors()) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, t.nbytes), 0);
    bufs.push_back(p);
    order.push_back(&t);
    rec.AddBuffer(t.name, static_cast<uint8_t*>(p), t.nbytes);
  }
  ASSERT_TRUE(rec.Start().ok());
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorInfo& t = *order[i];
    rec.SetTensor(rec.TensorIndex(t.name));
    const uint8_t* src = v0->data(t);
    if (t.shape.size() == 2) {
      const size_t rows = t.shape[0], cols = t.shape[1], w = t.width();
      for (size_t r = 0; r < rows; ++r) {  // source row r -> destination column r
        ASSERT_EQ(cudaMemcpy2D(static_cast<uint8_t*>(bufs[i]) + r * w, rows * w, src + r * cols * w,
                               w, w, cols, /*H2D*/ 1),
                  0);
      }
    } else {
      ASSERT_EQ(cudaMemcpy(bufs[i], src, t.nbytes, 1), 0);
    }
  }
  PlacementMap map = rec.Finish();
  EXPECT_EQ(map.converted.size(), 0u);
  EXPECT_EQ(map.bit_preserving_bytes(), v0->total_tensor_bytes());
  auto app = cuda::MakePlacementApplier(map, bufs, nullptr);
  ASSERT_TRUE(app.ok()) << app.status();
  DeltaOptions o;
  o.chunk_elems = 4096;
  DeltaMemorySink sink;
  ASSERT_TRUE(BuildDelta(v0.get(), *v1, o, &sink).ok());
  auto reader = DeltaReader::FromBytes(sink.Release());
  for (size_t i = 0; i < (*reader)->num_chunks(); ++i) {
    auto c = (*reader)->Decode(i);
    ASSERT_TRUE((*app)->ApplyChunk(*c).ok());
  }
  // Expected device image: v1 placed the same way, built on the host.
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorInfo& t = *v1->Find(order[i]->name);
    const uint8_t* src = v1->data(t);
    std::vector<uint8_t> want(t.nbytes), got(t.nbytes);
    if (t.shape.size() == 2) {
      const size_t rows = t.shape[0], cols = t.shape[1], w = t.width();
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c)
          std::memcpy(&want[(c * rows + r) * w], src + (r * cols + c) * w, w);
    } else {
      std::memcpy(want.data(), src, t.nbytes);
    }
    ASSERT_EQ(cudaMemcpy(got.data(), bufs[i], t.nbytes, /*D2H*/ 2), 0);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), t.nbytes)) << t.name;
  }
  for (void* p : bufs) cudaFree(p);
}

}  // namespace
}  // namespace dcr
