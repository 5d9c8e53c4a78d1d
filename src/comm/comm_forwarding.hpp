#pragma once
// A communicator layered on another one over the same group (comm_staged.cpp, comm_nccl.cpp).
// It forwards the calls such a layer never changes: the group's shape, the host-only gathers, and
// the fault-tolerance calls. Groups made from the inner one (split, split_node, shrink, spawn)
// come back wrapped in the same layer through wrap(), so a sub-group keeps its layer's behaviour.
// The inner group is owned, or borrowed from an owner that outlives the layer (comm_counting.hpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm.hpp"

namespace ntp {

class ForwardingComm : public Comm {
 public:
  explicit ForwardingComm(std::unique_ptr<Comm> inner) : inner_(inner.get()), owned_(std::move(inner)) {}
  explicit ForwardingComm(Comm& borrowed) : inner_(&borrowed) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  std::vector<int> allgather(int value) override { return inner_->allgather(value); }
  void gather(const double* send, std::size_t n, double* recv, int root) override {
    inner_->gather(send, n, recv, root);
  }
  std::vector<std::string> gather(const std::string& s, int root) override { return inner_->gather(s, root); }
  void barrier() override { inner_->barrier(); }
  std::string post(const std::string& message, int root) override { return inner_->post(message, root); }

  std::unique_ptr<Comm> split(int color, int key) override { return wrap_group(inner_->split(color, key)); }
  std::unique_ptr<Comm> split_node() override { return wrap_group(inner_->split_node()); }
  void revoke() override { inner_->revoke(); }
  bool agree(bool ok) override { return inner_->agree(ok); }
  bool peer_failed() override { return inner_->peer_failed(); }
  std::unique_ptr<Comm> shrink() override { return wrap_group(inner_->shrink()); }
  std::unique_ptr<Comm> spawn(const std::string& command, const std::vector<std::string>& args, int count,
                              const std::vector<std::string>& hosts) override {
    return wrap_group(inner_->spawn(command, args, count, hosts));
  }

 protected:
  // This layer over `inner`, a new group made from this one's inner communicator (never null).
  virtual std::unique_ptr<Comm> wrap(std::unique_ptr<Comm> inner) = 0;

  Comm* inner_;

 private:
  std::unique_ptr<Comm> owned_;  // inner_, when this layer owns it

  // split() gives no group to a rank passing a negative colour: nothing to wrap.
  std::unique_ptr<Comm> wrap_group(std::unique_ptr<Comm> c) { return c ? wrap(std::move(c)) : nullptr; }
};

}  // namespace ntp
