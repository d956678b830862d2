// Run-time CPU feature checks, so fast paths need no -march flag at build time. The code
// that uses the intrinsics includes <immintrin.h> itself (it is large, and only impl/ needs it).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HIVEMESH_X86 1
#endif

namespace hivemesh::compression::detail {

struct cpu_features {
    bool f16c = false; ///< AVX + F16C with YMM state enabled by the OS
    bool avx2 = false; ///< AVX2 with YMM state enabled by the OS
};

inline cpu_features detect_cpu_features() noexcept {
    cpu_features features;
#ifdef HIVEMESH_X86
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return features;
    constexpr unsigned osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((ecx & (osxsave | avx)) != (osxsave | avx)) return features;
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    if ((xcr0_low & 0x6u) != 0x6u) return features; // XMM and YMM state saved by the OS
    features.f16c = (ecx & f16c) != 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) features.avx2 = (ebx & (1u << 5)) != 0;
#endif
    return features;
}

inline const cpu_features& cpu() noexcept {
    static const cpu_features features = detect_cpu_features();
    return features;
}

} // namespace hivemesh::compression::detail
