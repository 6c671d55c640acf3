#include "mlp.h"

#include <ATen/ATen.h>

#include "capsule/model/spec_config.h"

namespace mlp {
namespace {

// ---- the model's math ----------------------------------------------------------------------
// One path over the shared weights, in `dtype`: fc1 = relu(x W1^T + b1), fc2 = h W2^T + b2,
// loss = mean squared error against the batch's labels.
at::Tensor Fc(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::ScalarType t) {
  return at::addmm(b.to(t), x.to(t), w.to(t).t());
}

// ---- what capsule needs ------------------------------------------------------------------------
struct Weights {
  at::Tensor w1, b1, w2, b2;
};

class Path : public capsule::LayerSequence {
 public:
  Path(Weights* w, at::ScalarType dtype, double fault) : w_(w), dtype_(dtype), fault_(fault) {}
  size_t size() const override { return 3; }
  std::string name(size_t i) const override { return i == 0 ? "fc1" : i == 1 ? "fc2" : "loss"; }
  at::ScalarType compute_dtype() const override { return dtype_; }
  capsule::TensorList Forward(size_t i, const capsule::TensorList& in,
                              const capsule::LayerBatch& batch) override {
    if (i == 0) return {at::relu(Fc(in[0], w_->w1, w_->b1, dtype_))};
    if (i == 1) return {Fc(in[0], w_->w2, w_->b2, dtype_) * fault_};
    return {at::mse_loss(in[0], batch.labels.to(dtype_))};
  }
  std::vector<capsule::NamedTensor> LayerParameters(size_t i) const override {
    if (i == 0) return {{"fc1.weight", w_->w1}, {"fc1.bias", w_->b1}};
    if (i == 1) return {{"fc2.weight", w_->w2}, {"fc2.bias", w_->b2}};
    return {};
  }

 private:
  Weights* w_;
  at::ScalarType dtype_;
  double fault_;
};

class Mlp : public capsule::Model {
 public:
  explicit Mlp(const Config& c)
      : config_(c), reference_(&w_, at::kDouble, 1.0), optimized_(&w_, at::kFloat, c.fault_scale) {
    at::manual_seed(c.seed);
    w_ = {at::randn({c.hidden, c.in}) * 0.3, at::zeros({c.hidden}),
          at::randn({c.out, c.hidden}) * 0.3, at::zeros({c.out})};
    for (at::Tensor* t : {&w_.w1, &w_.b1, &w_.w2, &w_.b2}) t->set_requires_grad(true);
  }
  capsule::LayerSequence& Path(capsule::PathKind k) override {
    return k == capsule::PathKind::kReference ? static_cast<capsule::LayerSequence&>(reference_)
                                              : optimized_;
  }
  std::vector<capsule::NamedTensor> NamedParameters() const override {
    auto p = optimized_.LayerParameters(0), q = optimized_.LayerParameters(1);
    p.insert(p.end(), q.begin(), q.end());
    return p;
  }
  capsule::ModelSpecInfo Spec() const override {
    capsule::SpecConfig s;
    s.Set("in", config_.in).Set("hidden", config_.hidden).Set("out", config_.out);
    s.Set("seed", config_.seed).Set("fault_scale", config_.fault_scale);
    return {"mlp", s.ToJson()};
  }

 private:
  Config config_;
  Weights w_;
  mlp::Path reference_, optimized_;
};

}  // namespace

std::unique_ptr<capsule::Model> MakeMlp(const Config& config) {
  return std::make_unique<Mlp>(config);
}

capsule::StatusOr<std::unique_ptr<capsule::Model>> MlpFromSpec(const capsule::ModelSpecInfo& spec) {
  CAPSULE_ASSIGN_OR_RETURN(capsule::SpecConfig s, capsule::SpecConfig::Parse(spec.config_json));
  Config c;
  CAPSULE_ASSIGN_OR_RETURN(c.in, s.GetInt("in"));
  CAPSULE_ASSIGN_OR_RETURN(c.hidden, s.GetInt("hidden"));
  CAPSULE_ASSIGN_OR_RETURN(c.out, s.GetInt("out"));
  CAPSULE_ASSIGN_OR_RETURN(c.seed, s.GetInt("seed"));
  CAPSULE_ASSIGN_OR_RETURN(c.fault_scale, s.GetDouble("fault_scale", 1.0));
  return MakeMlp(c);
}

}  // namespace mlp
