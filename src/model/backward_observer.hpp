#pragma once
// What the backward pass tells whoever consumes its gradients while it runs: the NTP gradient
// sync starts each layer's regroup as soon as that layer's gradients are final, so the exchange
// overlaps the backward of the layers below (the paper's design).
namespace ntp {

class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  // Every gradient of transformer layer `layer` is final (called for layers L-1 down to 0, on
  // every rank of the TP group at the same point).
  virtual void layer_gradients_ready(int layer) = 0;
};

}  // namespace ntp
