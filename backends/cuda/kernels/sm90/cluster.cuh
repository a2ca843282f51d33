// Thread-block clusters of sm_90 (PTX ISA, "Cluster of CTAs"): the CTAs of a cluster run at once on
// one GPC, may read and write each other's shared memory (distributed shared memory), and meet at a
// cluster-wide barrier. Launched with a cluster dimension (cudaLaunchKernelEx); sm_90a here, like
// wgmma.cuh.
#pragma once

#include <cstdint>

#include "kernels/sm90/bulk_copy.cuh"

namespace expanse_cuda {

// This CTA's rank in its cluster, the cluster's index in the grid, and the number of clusters.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
#if EXPANSE_SM90A_DEVICE
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ uint32_t cluster_index() {
  uint32_t r = 0;
#if EXPANSE_SM90A_DEVICE
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ uint32_t cluster_count() {
  uint32_t r = 1;
#if EXPANSE_SM90A_DEVICE
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
#endif
  return r;
}

// Stores v at `local` (this CTA's shared memory) as seen in the shared memory of the cluster's CTA
// `rank` (the same offset in that CTA's window), asynchronously: the store completes its 4 bytes
// on that CTA's barrier at `local_bar`'s offset (st.async); the receiver's mbarrier_wait on it then
// sees the value. Unlike a store followed by a releasing cluster barrier, it does not wait for this
// thread's other memory operations (copies still in flight) to complete.
__device__ __forceinline__ void store_remote_async(float* local, uint32_t rank, float v, uint64_t* local_bar) {
#if EXPANSE_SM90A_DEVICE
  uint32_t remote, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(local)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_bar) : "r"(smem_address(local_bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n" ::"r"(remote), "f"(v),
               "r"(remote_bar)
               : "memory");
#endif
}

// Every thread of every CTA of the cluster arrives, then waits for all: the shared-memory writes
// (local and remote) before it are visible to all of them after it (release, acquire). Called by all
// threads, converged.
__device__ __forceinline__ void cluster_sync() {
#if EXPANSE_SM90A_DEVICE
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

}  // namespace expanse_cuda
