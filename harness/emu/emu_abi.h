// emu_abi.h: how the driver (emu_driver.cpp, compiled once) calls a kernel: through a table of
// KernelEntry that runner.py appends to the kernel's source, one per kernel of the plan. Each entry
// converts the plan's arguments to the kernel's own parameter types.
#pragma once
#include <utility>

namespace kg_emu {

enum ArgKind { A_TENSOR, A_I32, A_I64, A_F32 };
struct Arg {
  ArgKind kind;
  void *ptr;
  long long i;
  float f;
};

// null where parameter type T takes argument a as the harness would pass it, else what T is
template <class T> inline const char *param_kind_mismatch(const Arg &a) {
  if constexpr (std::is_pointer_v<T>) return a.kind == A_TENSOR ? nullptr : "a pointer";
  else if constexpr (std::is_same_v<T, float>) return a.kind == A_F32 ? nullptr : "a float";
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 4)
    return a.kind == A_I32 ? nullptr : "a 4-byte integer";
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8) return a.kind == A_I64 ? nullptr : "an 8-byte integer";
  else return "a type the harness never passes (it passes pointers, int32, int64 and float32)";
}
template <class T> inline T param_value(const Arg &a) {
  if constexpr (std::is_pointer_v<T>) return (T)a.ptr;
  else if constexpr (std::is_same_v<T, float>) return a.f;
  else if constexpr (std::is_integral_v<T>) return (T)a.i;
  else return T{};
}

struct Mismatch {
  int index;  // -1: the counts differ; -2: none
  int expected;  // parameters of the kernel
  const char *what;
};
template <class F, F fn> struct Caller;
template <class... P, void (*fn)(P...)> struct Caller<void (*)(P...), fn> {
  static void call(const Arg *a) { call_with(a, std::index_sequence_for<P...>{}); }
  template <size_t... I> static void call_with(const Arg *a, std::index_sequence<I...>) { fn(param_value<P>(a[I])...); }
  static Mismatch check(const Arg *a, int n) {
    if (n != (int)sizeof...(P)) return Mismatch{-1, (int)sizeof...(P), nullptr};
    return mismatch(a, std::index_sequence_for<P...>{});
  }
  template <size_t... I> static Mismatch mismatch(const Arg *a, std::index_sequence<I...>) {
    const char *why[] = {param_kind_mismatch<P>(a[I])..., nullptr};
    for (int i = 0; i < (int)sizeof...(P); ++i)
      if (why[i]) return Mismatch{i, (int)sizeof...(P), why[i]};
    return Mismatch{-2, (int)sizeof...(P), nullptr};
  }
};
struct KernelEntry {
  const char *name;
  void (*call)(const Arg *);
  Mismatch (*check)(const Arg *, int);
};
#define KG_EMU_KERNEL(k) \
  kg_emu::KernelEntry { #k, &kg_emu::Caller<decltype(&k), &k>::call, &kg_emu::Caller<decltype(&k), &k>::check }

}  // namespace kg_emu

extern "C" const kg_emu::KernelEntry kg_emu_kernels[];  // runner.py writes the table after the source
extern "C" const int kg_emu_kernel_count;
