// Hopper's bulk copies into shared memory and the transaction barriers (mbarrier) that say when they
// have landed (sm_90a here, like wgmma.cuh).
//
// A producer thread announces the bytes it will copy into a buffer (arrive_expect_tx on the
// buffer's "full" barrier) and issues the copy; the copy engine completes those bytes on the same
// barrier, whose phase then flips. Consumers wait for the flip (the parity of the phase they
// expect), read the buffer and arrive on its "empty" barrier; the producer waits for that before it
// refills the buffer. Barriers live in shared memory, 8 bytes each, and start in phase 0.
#pragma once

#include <cstdint>

#include "kernels/sm90/wgmma.cuh"

// mbarrier and the proxy fence are sm_90 PTX, not architecture-specific: every device from Hopper on
// (kernels/sm100's tcgen05 products complete on them too).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define EXPANSE_MBARRIER_DEVICE 1
#else
#define EXPANSE_MBARRIER_DEVICE 0
#endif

namespace expanse_cuda {

// One barrier that completes a phase after `arrivals` arrivals (and the bytes announced with them).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if EXPANSE_MBARRIER_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
#endif
}
// Makes this thread's barrier initializations visible to the other threads and to the copy engine
// (before the CTA barrier that follows).
__device__ __forceinline__ void mbarrier_init_fence() {
#if EXPANSE_MBARRIER_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if EXPANSE_MBARRIER_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
#endif
}
// One arrival that also announces `bytes` more to be completed by copies before the phase ends.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if EXPANSE_MBARRIER_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#endif
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if EXPANSE_MBARRIER_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
// A position in a ring of buffers: the buffer, and the parity of the ring's round (the phase its
// "full" barrier completes in this round; the "empty" one completed the previous round's).
struct ring_position {
  uint32_t buf = 0, phase = 0;
  // Moves to the next buffer; true when the ring wraps.
  __device__ __forceinline__ bool advance(uint32_t ring) {
    if (++buf < ring) return false;
    buf = 0;
    phase ^= 1;
    return true;
  }
};

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory,
// completing them on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if EXPANSE_SM90A_DEVICE
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
#endif
}

// Adds four f32 values to global memory at `dst` (16-byte aligned), element by element in L2, as one
// vector reduction (red.global.add.v4.f32, sm_90).
__device__ __forceinline__ void red_add_v4(float* dst, float4 v) {
#if EXPANSE_SM90A_DEVICE
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#endif
}

// One arrival on `bar` once every cp.async this thread has issued so far has landed (counted in
// the barrier's arrivals at init: "noinc").
__device__ __forceinline__ void copy_async_arrive(uint64_t* bar) {
#if EXPANSE_SM90A_DEVICE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
#endif
}
// A barrier for `threads` threads (whole warps) of the CTA only, numbered `id` (1..15; 0 is
// __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Moves registers between warpgroups of a warp-specialized CTA: every warp of a warpgroup lowers
// (or raises) its per-thread register count to N together; ptxas then allocates the code that
// follows within N (with the kernel's register count fixed by __launch_bounds__).
template <int N>
__device__ __forceinline__ void warpgroup_registers_lower() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void warpgroup_registers_raise() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace expanse_cuda
