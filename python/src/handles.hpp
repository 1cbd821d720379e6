// A MultiHead forward's saved_state as PyTorch sees it: a one-byte uint8
// tensor whose storage (the state's `token`) the state owns through DLPack.
// The autograd graph keeps it while the backward may run; when PyTorch frees
// it, the state goes (and its module back to its pool). The backward finds
// the state again from the tensor's data pointer, so a tensor that is not a
// live handle (a copy, another tensor) is refused instead of read.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "kernels.hpp"

namespace difftx_python {

class handles {
 public:
  static nanobind::object export_state(std::unique_ptr<saved_state> state) {
    saved_state* raw = state.release();
    {
      std::lock_guard lock(mutex());
      live().emplace(&raw->token, raw);
    }
    nanobind::capsule owner(raw, [](void* p) noexcept {
      auto* s = static_cast<saved_state*>(p);
      {
        std::lock_guard lock(mutex());
        live().erase(&s->token);
      }
      delete s;
    });
    return nanobind::cast(nanobind::ndarray<nanobind::pytorch, std::uint8_t, nanobind::ndim<1>>(&raw->token, {1}, owner));
  }
  // The live state whose token is at `data`, or nullptr.
  static saved_state* find(const void* data) {
    std::lock_guard lock(mutex());
    const auto it = live().find(data);
    return it == live().end() ? nullptr : it->second;
  }

 private:
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static std::unordered_map<const void*, saved_state*>& live() {
    static auto* m = new std::unordered_map<const void*, saved_state*>();
    return *m;
  }
};

}  // namespace difftx_python
