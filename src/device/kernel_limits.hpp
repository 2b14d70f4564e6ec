// What the CUDA kernels can hold, which the forward plan and the workspace layout respect. Not
// tuning: each follows from a kernel's registers or shared memory, or from the workspace a call
// is given. Plain C++ (the plan is tested without a GPU).
#pragma once

#include <cstdint>

namespace twblas::cuda {

constexpr int64_t kDecodeMaxTokens = 4;          // the decode path's tokens (its workspace)
constexpr int64_t kDecodeMaxModelDim = 4096;     // its lanes hold 16 chunks of 8 values
constexpr int64_t kServeGateTokenCapacity = 16;  // serve_gate holds two x rows of 8 tokens
constexpr int64_t kServeGateRowsMaxTokens = 2;   // serve_gate_rows's instances: 1 and 2 tokens
// serve_down: a block of kServeDownWarps warps per (slice of kServeDownCols columns, token, group
// of units), each warp kServeDownBatch rows in flight; with groups (the plan keeps slices x tokens
// x groups <= kServeDownMaxBlocks) its partial rows take kServeDownMaxBlocks x kServeDownCols
// floats of the workspace, and its (slice, token) tickets at most kServeDownMaxBlocks words
constexpr int kServeDownCols = 256, kServeDownWarps = 16, kServeDownBatch = 8;
constexpr int64_t kServeDownMaxGroups = 16, kServeDownMaxBlocks = 256;
constexpr int64_t kFusedSplitMaxTokens = 128;    // the fused kernel splits a token's units up to here
constexpr int kFusedWarpChunks = 4;              // 16-byte chunks a lane of the fused kernel holds
constexpr int kFusedMaxTeamWarps = 8;            // its warps a token (registers near 100)

}  // namespace twblas::cuda
