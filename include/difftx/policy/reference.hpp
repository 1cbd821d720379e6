// policy::reference: plain scalar loops for any difftx::Scalar, no SIMD, no
// threads. It is the oracle every other policy is tested against, so its
// kernels (policy/reference/*.hpp) follow the formulas of docs/backward.md line
// by line and accumulate in scalar_traits<T>::accum_type.
#pragma once

#include "difftx/policy/reference/tag.hpp"

#include "difftx/policy/reference/attention.hpp"
#include "difftx/policy/reference/attention_decode.hpp"
#include "difftx/policy/reference/cross_entropy.hpp"
#include "difftx/policy/reference/diff_heads.hpp"
#include "difftx/policy/reference/diff_lambda.hpp"
#include "difftx/policy/reference/elementwise.hpp"
#include "difftx/policy/reference/embedding.hpp"
#include "difftx/policy/reference/linear.hpp"
#include "difftx/policy/reference/linear_int8.hpp"
#include "difftx/policy/reference/rmsnorm.hpp"
#include "difftx/policy/reference/rope.hpp"
#include "difftx/policy/reference/swiglu.hpp"
