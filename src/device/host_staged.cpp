#include "host_staged.hpp"

#include <algorithm>
#include <vector>

#include "common/check.hpp"
#include "common/pointer_check.hpp"

namespace twblas::cuda {

namespace {

size_t dense_bytes(const twDnMatDescr &d) {
    if (d.empty()) return 0;
    const int64_t outer = d.order == TW_ORDER_ROW ? d.rows : d.cols, inner = d.order == TW_ORDER_ROW ? d.cols : d.rows;
    return static_cast<size_t>((outer - 1) * d.ld + inner) * elem_bytes(d.type);
}
size_t sparse_bytes(const twSpMatDescr &s) { return s.format == TW_FORMAT_TWELL ? s.twell.bytes() : s.hybrid.total; }

/// A host mirror of one device buffer, copied in on creation and out on demand.
class Staged {
  public:
    Staged(cudaStream_t stream, void *device, size_t bytes) : stream_(stream), device_(device), host_(bytes) {
        if (bytes)
            check(cudaMemcpyAsync(host_.data(), device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    void *host() { return host_.data(); }
    void write_back() {
        if (!host_.empty())
            check(cudaMemcpyAsync(device_, host_.data(), host_.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

  private:
    cudaStream_t stream_;
    void *device_;
    std::vector<uint8_t> host_;
};

struct StagedDense {
    Staged buf;
    twDnMatDescr d;
    StagedDense(cudaStream_t s, const twDnMatDescr &dev) : buf(s, dev.values, dense_bytes(dev)), d(dev) { d.values = buf.host(); }
};
struct StagedSparse {
    Staged buf;
    twSpMatDescr d;
    StagedSparse(cudaStream_t s, const twSpMatDescr &dev) : buf(s, dev.buffer, sparse_bytes(dev)), d(dev) { d.buffer = buf.host(); }
};

}  // namespace

twSpMatInfo_t HostStaged::sparse_info(cudaStream_t stream, const twSpMatDescr &s) {
    require_device_accessible(s.buffer, "descr");
    StagedSparse h(stream, s);
    return ref_.sparse_info(h.d);
}

void HostStaged::sparse_validate(cudaStream_t stream, const twSpMatDescr &s) {
    require_device_accessible(s.buffer, "descr");
    StagedSparse h(stream, s);
    ref_.sparse_validate(h.d);
}

twStatus_t HostStaged::dense_to_sparse_analysis(cudaStream_t stream, const twDnMatDescr &in, const twSpMatDescr &out,
                                                twConvertOp_t op) {
    require_device_accessible(in.values, "in");
    StagedDense h(stream, in);
    std::vector<uint8_t> stamp(ref_.dense_to_sparse_workspace(h.d, out));
    return ref_.dense_to_sparse_analysis(h.d, out, op, stamp.data());
}

twStatus_t HostStaged::sparse_to_dense(cudaStream_t stream, const twSpMatDescr &in, const twDnMatDescr &out) {
    require_device_accessible(in.buffer, "in");
    require_device_accessible(out.values, "out");
    StagedSparse hi(stream, in);
    StagedDense ho(stream, out);
    const twStatus_t st = ref_.sparse_to_dense(hi.d, ho.d);
    if (st == TW_STATUS_SUCCESS) ho.buf.write_back();
    return st;
}

twStatus_t HostStaged::sparse_to_sparse(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out,
                                        twStatus_t (Backend::*op)(const twSpMatDescr &, const twSpMatDescr &)) {
    require_device_accessible(in.buffer, "in");
    require_device_accessible(out.buffer, "out");
    StagedSparse hi(stream, in), ho(stream, out);
    const twStatus_t st = (ref_.*op)(hi.d, ho.d);
    ho.buf.write_back();  // also after CAPACITY_EXCEEDED: `out` records what did not fit
    return st;
}

twStatus_t HostStaged::sparse_convert(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out) {
    return sparse_to_sparse(stream, in, out, &Backend::sparse_convert);
}

twStatus_t HostStaged::sparse_transpose(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out) {
    return sparse_to_sparse(stream, in, out, &Backend::sparse_transpose);
}

twStatus_t HostStaged::capacity_status(cudaStream_t stream, const twSpMatDescr &out) {
    uint32_t needed = 0;
    const size_t at = out.format == TW_FORMAT_TWELL ? out.twell.overflow_offset_words() * 4 : out.hybrid.backup_count;
    check(cudaMemcpyAsync(&needed, static_cast<uint8_t *>(out.buffer) + at, 4, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const int64_t lost = out.format == TW_FORMAT_TWELL ? static_cast<int64_t>(needed)
                                                       : std::max<int64_t>(0, static_cast<int32_t>(needed) - out.hybrid.backup_rows);
    if (lost > 0)
        fail(TW_STATUS_CAPACITY_EXCEEDED, "out: %lld rows do not fit the container (recorded in it; see twSpMatGetInfo)",
             static_cast<long long>(lost));
    return TW_STATUS_SUCCESS;
}

}  // namespace twblas::cuda
