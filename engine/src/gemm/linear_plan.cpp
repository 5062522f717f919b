// Engine::plan_linear: the quantizers of a linear layer's three roles and how each of its three
// GEMMs (fprop, dgrad, wgrad) runs on a target, from the operands' traits (gemm/pairing.cpp).
#include "qrecipe/checked.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/gemm.hpp"

namespace qrecipe {

namespace {

OperandTraits operand_traits(const std::shared_ptr<Quantizer>& q, std::int64_t rows,
                             std::int64_t cols, qr_direction direction, GemmKind kind,
                             const std::string& module) {
  if (!q) return OperandTraits::high_precision(DType::bf16);
  try {
    return OperandTraits::of(q->layout(rows, cols, direction), direction);
  } catch (const Error& e) {
    QR_THROW(module, ": ", gemm_kind_name(kind), " needs the ", direction_name(direction),
             " direction of ", q->role().tensor_type, " [", rows, "x", cols, "] from ",
             q->spec().str(), ", which cannot provide it: ", e.message());
  }
}

}  // namespace

LinearPlan Engine::plan_linear(const std::string& module_type, const std::string& name,
                               std::int64_t in_features, std::int64_t out_features,
                               std::int64_t tokens, GemmTarget target) {
  QR_CHECK(in_features > 0 && out_features > 0 && tokens > 0, "linear ", name, ": in_features ",
           in_features, ", out_features ", out_features, " and tokens ", tokens,
           " must all be positive");
  // x [tokens, in], W [out, in], dy [tokens, out]: each must be countable.
  checked_mul(tokens, in_features, "linear " + name + ": input [tokens x in_features]");
  checked_mul(out_features, in_features, "linear " + name + ": weight [out_features x in_features]");
  checked_mul(tokens, out_features, "linear " + name + ": grad_output [tokens x out_features]");
  LinearPlan p;
  p.input = {module_type, "input", name};
  p.weight = {module_type, "weight", name};
  p.grad_output = {module_type, "grad_output", name};
  p.input_q = resolve(p.input);
  p.weight_q = resolve(p.weight);
  p.grad_output_q = resolve(p.grad_output);
  const std::string module = module_type + " " + name;
  const auto R = QR_DIRECTION_ROWWISE, C = QR_DIRECTION_COLUMNWISE;
  auto make = [&](GemmKind kind, const std::shared_ptr<Quantizer>& qa, std::int64_t ra,
                  std::int64_t ca, qr_direction da, const std::shared_ptr<Quantizer>& qb,
                  std::int64_t rb, std::int64_t cb, qr_direction db) {
    LinearPlan::Gemm g{kind, operand_traits(qa, ra, ca, da, kind, module),
                       operand_traits(qb, rb, cb, db, kind, module)};
    g.m = da == R ? ra : ca;
    g.n = db == R ? rb : cb;
    g.k = da == R ? ca : ra;
    g.plan = plan_gemm(kind, g.a, g.b, target, g.m, g.n, g.k);
    return g;
  };
  // x [tokens, in], W [out, in], dy [tokens, out]
  p.fprop = make(GemmKind::fprop, p.input_q, tokens, in_features, R, p.weight_q, out_features,
                 in_features, R);
  p.dgrad = make(GemmKind::dgrad, p.grad_output_q, tokens, out_features, R, p.weight_q,
                 out_features, in_features, C);
  p.wgrad = make(GemmKind::wgrad, p.grad_output_q, tokens, out_features, C, p.input_q, tokens,
                 in_features, C);
  return p;
}

}  // namespace qrecipe
