#pragma once
// The one resharding primitive. Given where every unit of a dimension lives now (src owner per
// unit, ranks of one communicator) and where it must live (dst owner per unit), it plans which
// units go from which rank to which and moves any number of tensors of that dimension in one
// exchange. Every data movement between layouts uses it: checkpoint gathers, healing, revival,
// NTP re-layout and the NTP gradient reshards.
//
// Storage convention: a rank keeps the units it owns under a placement in ascending unit order,
// each unit a contiguous block of unit_elems floats.
#include <memory>
#include <vector>

#include "backend.hpp"
#include "comm.hpp"

namespace ntp {

inline constexpr int kNowhere = -1;  // a unit no rank holds (src) or no rank needs (dst)

class ReshardPlan {
 public:
  // Throws when a unit needed at dst has no source. src_rows, when given, is this rank's own
  // storage index of every unit it holds (-1 elsewhere): a source may hold more units than the
  // plan takes from it (one replica among several serving as the source). By default a rank's
  // storage is exactly the units src_owner assigns it.
  ReshardPlan(const std::vector<int>& src_owner, const std::vector<int>& dst_owner, int my_rank, int comm_size,
              const std::vector<int>* src_rows = nullptr);

  // Several plans as one (one exchange instead of several): unit u of part k becomes unit
  // offset_k + u of segment k; a tensor names its segment (ReshardTensor::segment).
  static ReshardPlan combine(const std::vector<ReshardPlan>& parts);

  // Units this rank sends to / receives from each peer (ascending), and keeps in place.
  const std::vector<std::vector<int>>& sends() const { return send_units_; }
  const std::vector<std::vector<int>>& recvs() const { return recv_units_; }
  const std::vector<int>& kept() const { return kept_units_; }
  int src_count() const { return src_count_; }  // units this rank sends or keeps
  int dst_count() const { return dst_count_; }  // units this rank holds after
  long units_moved_out() const;                 // units sent to other ranks

  int src_index(int unit) const { return src_index_[unit]; }
  int dst_index(int unit) const { return dst_index_[unit]; }
  int segments() const { return static_cast<int>(segment_begin_.size()) - 1; }
  int segment_begin(int k) const { return segment_begin_[k]; }
  int segment_end(int k) const { return segment_begin_[k + 1]; }

 private:
  ReshardPlan() = default;
  std::vector<int> segment_begin_;  // unit ranges of the segments
  std::vector<std::vector<int>> send_units_, recv_units_;
  std::vector<int> kept_units_;
  std::vector<int> src_index_, dst_index_;
  int src_count_ = 0, dst_count_ = 0;
};

struct ReshardTensor {
  const float* src;  // the segment's source units (this rank's storage; null where it holds none)
  float* dst;        // the segment's destination units; must not overlap src, except that a kept
                     // unit may already be in place (same address: nothing to copy)
  long unit_elems;
  int segment = 0;   // which segment of a combined plan the tensor's units are
};

// A reshard in flight: construction packs what this rank sends, copies the units it keeps and
// posts the all-to-all over `comm` (every rank of comm starts the same exchanges in the same
// order); finish() waits and unpacks. The plan and the tensors' buffers must outlive it, and the
// destinations are complete only after finish(). Destroying an unfinished exchange waits for it
// (the buffers must outlive it) without unpacking.
//
// Tensors may live in backend (device) memory: with `be` given, packing and unpacking copy through
// it wherever a tensor is device memory. Consecutive units go in one copy.
class ReshardExchange {
 public:
  ReshardExchange(Comm& comm, const ReshardPlan& plan, std::vector<ReshardTensor> tensors, Backend* be = nullptr);
  ~ReshardExchange();
  ReshardExchange(const ReshardExchange&) = delete;
  ReshardExchange& operator=(const ReshardExchange&) = delete;

  bool test();    // progresses the exchange; true once finish() would not wait
  void finish();  // waits and unpacks (once; later calls do nothing)
  bool finished() const { return request_ == nullptr; }
  double bytes_sent() const { return double(sendbuf_.size()) * sizeof(float); }
  double bytes_received() const { return double(recvbuf_.size()) * sizeof(float); }

 private:
  // Copies n floats, through the backend when a side is device memory.
  void move(bool device, float* dst, const float* src, std::size_t n) const;

  const ReshardPlan& plan_;
  std::vector<ReshardTensor> tensors_;
  Backend* be_;
  std::vector<char> src_device_, dst_device_;  // per tensor
  std::vector<int> rcount_;
  std::vector<float> sendbuf_, recvbuf_;
  std::unique_ptr<CommRequest> request_;
};

// What one rank's side of a reshard moved over its link, each way.
struct ReshardBytes {
  double sent = 0, received = 0;
};
// Executes the plan for every tensor in one all-to-all over `comm` (every rank of comm calls it).
ReshardBytes reshard(Comm& comm, const ReshardPlan& plan, const std::vector<ReshardTensor>& tensors,
                     Backend* be = nullptr);

}  // namespace ntp
