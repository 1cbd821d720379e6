// A composite module's inference forms of its Linears (modules/linear.hpp
// says what each is): int8 weights, decoding panels and packed copies, for
// every Linear that Module::visit_linears(module, f) hands to f. Written here
// once, so that a module lists its projections in one place.
#pragma once

namespace difftx::detail {

template <class Module>
class linear_weight_forms {
 public:
  // f(Linear&) or, on a const module, f(const Linear&) for each projection.
  template <class F>
  void for_each_linear(F&& f) {
    Module::visit_linears(self(), f);
  }
  template <class F>
  void for_each_linear(F&& f) const {
    Module::visit_linears(self(), f);
  }
  void quantize_weights() {
    for_each_linear([](auto& l) { l.quantize_weights(); });
  }
  void add_decoding_panels() {
    for_each_linear([](auto& l) { l.add_decoding_panels(); });
  }
  void add_packed_weights() {
    for_each_linear([](auto& l) { l.add_packed_weights(); });
  }

 private:
  Module& self() noexcept { return static_cast<Module&>(*this); }
  const Module& self() const noexcept { return static_cast<const Module&>(*this); }
};

}  // namespace difftx::detail
