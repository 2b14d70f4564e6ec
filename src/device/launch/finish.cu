// The end of every sparse forward: the statistics reduced in a fixed order (deterministic) and
// published for the next call's plan, then the optional hidden output (kernels/finalize.cuh).
#include "launch/launch.hpp"

#include <algorithm>

#include "common/check.hpp"
#include "common/dependent_launch.cuh"
#include "common/dispatch.hpp"
#include "kernels/finalize.cuh"

namespace twblas::cuda {

void write_hidden_output(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, const twSpMatDescr *hidden,
                         const ActiveMask &gate_mask, void *h_values) {
    if (!hidden) return;
    // PLAIN keeps every stored pattern but +0, as the reference does
    const MatrixArg h{h_values ? h_values : s.gate, p.m, p.h, s.ldg, 1, p.gate_f32() ? TW_R_32F : p.type};
    write_sparse(stream, h, TW_CONVERT_PLAIN, *hidden, s.writer_flags, gate_mask);
}

void launch_finish(cudaStream_t stream, const FfnCall &c, bool dense_l1, int64_t first, const twSpMatDescr *hidden,
                   const ActiveMask &gate_mask) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    // without dense-path rows to sum, block 0 does all of finalize's work
    const unsigned blocks =
        dense_l1 ? static_cast<unsigned>(std::max(1, std::min(264, ceil_div(p.m, kFinalThreads / 32)))) : 1u;
    by_type(p.type, [&](auto tag) {
        using T = decltype(tag);
        launch_dependent(finalize<T>, dim3(blocks), dim3(kFinalThreads), 0, stream, c.st.pdl,
                         "cudaLaunchKernelEx(finalize)", s.gate, s.ldg, p.h, p.gate_f32(), !p.gated, s.dense_rows,
                         s.dense_count, dense_l1, first, p.m, s.row_nnz, s.count, s.row_l1, s.header + 1,
                         c.st.stats_block(), c.st.feedback.device());
    });
    write_hidden_output(stream, p, s, hidden, gate_mask);
}

}  // namespace twblas::cuda
