// difftx: Differential Transformer layers with hand-derived backward passes.
// Include this one header for the modules on the reference policy, the
// optimiser, gradcheck and the number types; policy::simd and policy::cuda
// have their own headers.
#pragma once

#include "difftx/core/checks.hpp"
#include "difftx/core/error.hpp"
#include "difftx/core/random.hpp"
#include "difftx/core/scalar_traits.hpp"
#include "difftx/core/tensor.hpp"
#include "difftx/core/transfer.hpp"
#include "difftx/modules/attention.hpp"
#include "difftx/modules/attention_maps.hpp"
#include "difftx/modules/copy_parameters.hpp"
#include "difftx/modules/cross_entropy.hpp"
#include "difftx/modules/decoder_layer.hpp"
#include "difftx/modules/diff_attn.hpp"
#include "difftx/modules/embedding.hpp"
#include "difftx/modules/kv_cache.hpp"
#include "difftx/modules/language_model.hpp"
#include "difftx/modules/linear.hpp"
#include "difftx/modules/multihead.hpp"
#include "difftx/modules/multihead_v2.hpp"
#include "difftx/modules/non_finite.hpp"
#include "difftx/modules/parameter.hpp"
#include "difftx/modules/rmsnorm.hpp"
#include "difftx/modules/sequences.hpp"
#include "difftx/modules/stack.hpp"
#include "difftx/modules/swiglu.hpp"
#include "difftx/optim/adamw.hpp"
#include "difftx/policy/reference.hpp"
#include "difftx/testing/gradcheck.hpp"
