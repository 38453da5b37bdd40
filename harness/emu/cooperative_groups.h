// The part of cooperative groups that our tasks and common generated code use: the thread
// block as a group. Anything else fails to compile here and is reported as `unsupported`.
#pragma once
#include <cuda_runtime.h>

namespace cooperative_groups {
struct thread_block {
    void sync() const { __syncthreads(); }
    unsigned thread_rank() const { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
    unsigned size() const { return blockDim.x * blockDim.y * blockDim.z; }
    unsigned num_threads() const { return size(); }
    dim3 group_index() const { return blockIdx; }
    dim3 thread_index() const { return threadIdx; }
    dim3 group_dim() const { return blockDim; }
    dim3 dim_threads() const { return blockDim; }
};
inline thread_block this_thread_block() { return thread_block(); }
inline void sync(const thread_block& block) { block.sync(); }
}  // namespace cooperative_groups
