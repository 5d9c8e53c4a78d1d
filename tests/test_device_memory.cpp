// Host staging of device buffers (src/comm_staged), on the encoded stand-in for device memory:
// what the ranks that share a GPU run, tested without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "arena.hpp"
#include "comm.hpp"
#include "comm_staged.hpp"
#include "encoded_memory_backend.hpp"
#include "test_util.hpp"

namespace ntp::test {
namespace {

// Host copy of a device buffer, and back.
std::vector<float> read(Backend& be, const float* dev, std::size_t n) {
  std::vector<float> h(n);
  be.to_host(h.data(), dev, n);
  return h;
}
void write(Backend& be, float* dev, const std::vector<float>& h) { be.from_host(dev, h.data(), h.size()); }

// Small integers: sums are exact in any order.
float value(int rank, std::size_t i) { return float((rank * 31 + int(i) * 7) % 17) - 8.0f; }

// The stand-in bites: MPI on its buffers without staging sums the encoded bits, which decode to
// something else. (If this passed through, the tests below could not tell staging from none.)
TEST(EncodedMemory, UnstagedMpiCannotReadIt) {
  EncodedMemoryBackend be;
  auto world = world_comm();
  const std::size_t n = 64;
  Arena buf(be, n);
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = value(world->rank(), i);
  write(be, buf.data(), h);
  world->allreduce_sum(buf.data(), n);
  const auto got = read(be, buf.data(), n);
  int right = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < world->size(); ++r) sum += value(r, i);
    right += got[i] == sum;
  }
  ASSERT_GT(world->size(), 1) << "run under mpiexec with 2 or more ranks";
  EXPECT_LT(right, int(n) / 2);
}

TEST(HostStagedComm, CollectivesOnDeviceBuffers) {
  EncodedMemoryBackend be;
  auto world = make_host_staged_comm(world_comm(), be);
  const int me = world->rank(), P = world->size();
  const std::size_t n = 1000;

  // all-reduce sum and max
  Arena a(be, n), m(be, n);
  std::vector<float> h(n), hm(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = value(me, i), hm[i] = float((me * 13 + int(i)) % P);
  write(be, a.data(), h);
  write(be, m.data(), hm);
  world->allreduce_sum(a.data(), n);
  world->allreduce_max(m.data(), n);
  const auto sum = read(be, a.data(), n), mx = read(be, m.data(), n);
  int wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float s = 0, x = -1;
    for (int r = 0; r < P; ++r) s += value(r, i), x = std::max(x, float((r * 13 + int(i)) % P));
    wrong += sum[i] != s || mx[i] != x;
  }
  EXPECT_EQ(wrong, 0) << "rank " << me;

  // broadcast from the last rank
  Arena b(be, n);
  for (std::size_t i = 0; i < n; ++i) h[i] = value(me, i);
  write(be, b.data(), h);
  world->broadcast(b.data(), n * sizeof(float), P - 1);
  const auto got_b = read(be, b.data(), n);
  wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += got_b[i] != value(P - 1, i);
  EXPECT_EQ(wrong, 0) << "rank " << me;

  // all-to-all(v), blocking and nonblocking, device to device and host to device: rank p gets
  // p + 1 floats from each rank, at displacements with a gap of 3 floats between peers (the gaps
  // keep their contents).
  std::vector<int> sc(P), sd(P), rc(P, me + 1), rd(P);
  int stotal = 0;
  for (int p = 0; p < P; ++p) sc[p] = p + 1, sd[p] = stotal, stotal += p + 1;
  for (int p = 0; p < P; ++p) rd[p] = p * (me + 1 + 3);
  const std::size_t rn = std::size_t(P) * (me + 1 + 3);
  std::vector<float> hs(stotal);
  for (int p = 0; p < P; ++p)
    for (int k = 0; k < sc[p]; ++k) hs[sd[p] + k] = float(me * 1000 + p * 10 + k);
  Arena s_dev(be, stotal);
  write(be, s_dev.data(), hs);
  for (const bool host_send : {false, true})
    for (const bool nonblocking : {false, true}) {
      SCOPED_TRACE(std::string(host_send ? "host" : "device") + " send, " + (nonblocking ? "ialltoallv" : "alltoallv"));
      Arena r_dev(be, rn);
      write(be, r_dev.data(), std::vector<float>(rn, -7.0f));
      const float* send = host_send ? hs.data() : s_dev.data();
      if (nonblocking)
        world->ialltoallv(send, sc, sd, r_dev.data(), rc, rd)->wait();
      else
        world->alltoallv(send, sc, sd, r_dev.data(), rc, rd);
      const auto got = read(be, r_dev.data(), rn);
      wrong = 0;
      for (int p = 0; p < P; ++p)
        for (int k = 0; k < me + 1 + 3; ++k)
          wrong += got[rd[p] + k] != (k <= me ? float(p * 1000 + me * 10 + k) : -7.0f);
      EXPECT_EQ(wrong, 0) << "rank " << me;
    }

  // Split communicators stage too.
  auto half = world->split(me % 2, me);
  Arena c(be, n);
  write(be, c.data(), std::vector<float>(n, 1.0f));
  half->allreduce_sum(c.data(), n);
  const auto got_c = read(be, c.data(), n);
  EXPECT_EQ(got_c[0], float(half->size()));
  EXPECT_EQ(got_c[n - 1], float(half->size()));
}

}  // namespace
}  // namespace ntp::test
