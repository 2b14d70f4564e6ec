#include "container_ops.hpp"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include "common/dependent_launch.cuh"
#include "common/pointer_check.hpp"
#include "host/container_checks.hpp"
#include "kernels/container_convert.cuh"
#include "kernels/container_inspect.cuh"
#include "sparse_ops.hpp"

namespace twblas::cuda {

namespace {

constexpr int kWarpsPerBlock = kWarpsPerRowBlock;  // the row kernels: one warp per row
static_assert(32 * kWarpsPerBlock == kCheckThreads, "twell_check_rows sizes its bitmaps by its block");
unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::max(1, ceil_div(rows, kWarpsPerBlock))); }
/// Blocks of `threads` for a grid-stride loop over n items (at most 4096, at least one).
unsigned flat_blocks(int64_t n, int threads = 256) {
    return static_cast<unsigned>(std::min<int64_t>(4096, std::max<int64_t>(1, (n + threads - 1) / threads)));
}

/// Copies `bytes` at `src` back to the host after the stream's work (the sparse -> sparse
/// conversions' entry totals; ContainerOps::read_back for the verdicts).
void read_back(cudaStream_t stream, void *dst, const void *src, size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

/// Device memory for one setup call, ordered on its stream (the conversions' APIs have no
/// workspace), from the handle's pool.
class StreamScratch {
  public:
    StreamScratch(cudaStream_t stream, cudaMemPool_t pool) : stream_(stream), pool_(pool) {}
    ~StreamScratch() {
        for (void *p : blocks_) (void)cudaFreeAsync(p, stream_);
    }
    StreamScratch(const StreamScratch &) = delete;
    StreamScratch &operator=(const StreamScratch &) = delete;
    template <class T> T *take(size_t count) {
        void *p = nullptr;
        if (cudaMallocFromPoolAsync(&p, std::max<size_t>(1, count * sizeof(T)), pool_, stream_) != cudaSuccess) {
            (void)cudaGetLastError();
            fail(TW_STATUS_ALLOC_FAILED, "cudaMallocFromPoolAsync of %zu bytes failed", count * sizeof(T));
        }
        blocks_.push_back(p);
        return static_cast<T *>(p);
    }

  private:
    cudaStream_t stream_;
    cudaMemPool_t pool_;
    std::vector<void *> blocks_;
};

/// Entry lists and the memory that holds them.
struct Lists {
    EntryLists lists{};
    int64_t rows = 0, nnz = 0;
};

/// ptr = exclusive sum of counts[0 .. rows - 1] (counts[rows] must be 0); returns the total.
int64_t exclusive_sum(cudaStream_t stream, StreamScratch &scratch, int64_t *counts, int64_t *ptr, int64_t rows) {
    size_t bytes = 0;
    check(cub::DeviceScan::ExclusiveSum(nullptr, bytes, counts, ptr, rows + 1, stream), "cub::DeviceScan");
    void *temp = scratch.take<uint8_t>(bytes);
    check(cub::DeviceScan::ExclusiveSum(temp, bytes, counts, ptr, rows + 1, stream), "cub::DeviceScan");
    int64_t total = 0;
    read_back(stream, &total, ptr + rows, sizeof total);
    return total;
}

/// The entries of a validated, complete container, row by row in column order.
Lists read_lists(cudaStream_t stream, StreamScratch &scratch, const twSpMatDescr &in) {
    const ContainerArgs c = container_args(in);
    const bool twell = in.format == TW_FORMAT_TWELL;
    Lists l;
    l.rows = in.rows;
    auto *counts = scratch.take<int64_t>(static_cast<size_t>(in.rows) + 1);
    auto *ptr = scratch.take<int64_t>(static_cast<size_t>(in.rows) + 1);
    check(cudaMemsetAsync(counts + in.rows, 0, sizeof(int64_t), stream), "cudaMemsetAsync");
    if (in.rows > 0) {
        count_row_entries<<<row_blocks(in.rows), 32 * kWarpsPerBlock, 0, stream>>>(c, twell, counts);
        check_launch("count_row_entries");
    }
    l.nnz = exclusive_sum(stream, scratch, counts, ptr, in.rows);
    l.lists = {ptr, scratch.take<int32_t>(static_cast<size_t>(l.nnz)), scratch.take<uint32_t>(static_cast<size_t>(l.nnz))};
    if (in.rows > 0) {
        fill_row_entries<<<row_blocks(in.rows), 32 * kWarpsPerBlock, 0, stream>>>(c, twell, l.lists);
        check_launch("fill_row_entries");
    }
    return l;
}

/// The lists of the transpose (`cols` rows): a stable sort of the entries by column.
Lists transpose_lists(cudaStream_t stream, StreamScratch &scratch, const Lists &in, int64_t cols) {
    if (in.nnz > INT32_MAX)
        fail(TW_STATUS_NOT_SUPPORTED, "in: %lld stored values; the device transpose takes at most 2^31 - 1",
             static_cast<long long>(in.nnz));
    const int n = static_cast<int>(in.nnz);
    auto *keys = scratch.take<uint16_t>(2 * static_cast<size_t>(n));
    auto *pairs = scratch.take<uint64_t>(2 * static_cast<size_t>(n));
    if (in.rows > 0) {
        entries_to_pairs<<<row_blocks(in.rows), 32 * kWarpsPerBlock, 0, stream>>>(in.lists, in.rows, keys, pairs);
        check_launch("entries_to_pairs");
    }
    cub::DoubleBuffer<uint16_t> k(keys, keys + n);
    cub::DoubleBuffer<uint64_t> v(pairs, pairs + n);
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k, v, n, 0, 16, stream), "cub::DeviceRadixSort");
    void *temp = scratch.take<uint8_t>(bytes);
    check(cub::DeviceRadixSort::SortPairs(temp, bytes, k, v, n, 0, 16, stream), "cub::DeviceRadixSort");

    Lists out;
    out.rows = cols;
    out.nnz = in.nnz;
    auto *counts = scratch.take<int64_t>(static_cast<size_t>(cols) + 1);
    auto *ptr = scratch.take<int64_t>(static_cast<size_t>(cols) + 1);
    check(cudaMemsetAsync(counts, 0, (static_cast<size_t>(cols) + 1) * sizeof(int64_t), stream), "cudaMemsetAsync");
    count_keys<<<flat_blocks(n), 256, 0, stream>>>(k.Current(), n, counts);
    check_launch("count_keys");
    exclusive_sum(stream, scratch, counts, ptr, cols);
    out.lists = {ptr, scratch.take<int32_t>(static_cast<size_t>(n)), scratch.take<uint32_t>(static_cast<size_t>(n))};
    pairs_to_entries<<<flat_blocks(n), 256, 0, stream>>>(v.Current(), n, out.lists);
    check_launch("pairs_to_entries");
    return out;
}

/// Writes every row of `out` from the lists, with the record / backup slots in row order (their
/// count also into `published`).
void write_lists(cudaStream_t stream, StreamScratch &scratch, const Lists &in, const twSpMatDescr &out,
                 int32_t *published) {
    const ContainerArgs c = container_args(out);
    const bool twell = out.format == TW_FORMAT_TWELL;
    if (out.rows == 0) return write_empty(stream, out);
    auto *flags = scratch.take<int32_t>(static_cast<size_t>(out.rows));
    if (twell)
        twell_from_entries<<<row_blocks(out.rows), 32 * kWarpsPerBlock, 0, stream>>>(in.lists, c, flags);
    else
        hybrid_from_entries<<<row_blocks(out.rows), 32 * kWarpsPerBlock, 0, stream>>>(in.lists, c, flags);
    check_launch("container from entries");
    assign_overflow_slots(stream, flags, out, published);
    if (!twell) {
        hybrid_backup_from_entries<<<static_cast<unsigned>(out.rows), 256, 0, stream>>>(in.lists, c, flags);
        check_launch("hybrid_backup_from_entries");
    }
}

size_t dense_bytes_of(const twDnMatDescr &d) {
    const bool row = d.order == TW_ORDER_ROW;
    return static_cast<size_t>(row ? d.cols : d.rows) * elem_bytes(d.type);
}

/// The check of one item found on the device did not fail on the host: the kernels and
/// container_checks.cpp disagree.
[[noreturn]] void checks_disagree(const char *what) {
    fail(TW_STATUS_INTERNAL_ERROR, "twSpMatValidate: the device flagged %s that the host check accepts", what);
}

}  // namespace

ScratchPool::~ScratchPool() {
    if (pool_) (void)cudaMemPoolDestroy(pool_);
}

cudaMemPool_t ScratchPool::get() {
    if (pool_) return pool_;
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    if (cudaMemPoolCreate(&pool_, &props) != cudaSuccess) {
        (void)cudaGetLastError();
        pool_ = nullptr;
        fail(TW_STATUS_ALLOC_FAILED, "cudaMemPoolCreate failed");
    }
    uint64_t keep = kKeepBytes;
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    return pool_;
}

ContainerOps::ContainerOps(const DeviceInfo &device)
    : result_(2 * sizeof(InspectResult)), pdl_(device.pdl), full_grid_(16 * static_cast<unsigned>(device.sm_count)),
      scratch_pool_(device.device) {
    // both slots clear before the first call (setup: a blocking copy)
    const InspectResult clear[2] = {clear_result(), clear_result()};
    check(cudaMemcpy(result_.get(), clear, sizeof clear, cudaMemcpyHostToDevice), "cudaMemcpy");
}

unsigned ContainerOps::stride_blocks(int64_t rows) const { return std::min(row_blocks(rows), full_grid_); }

ContainerOps::Slots ContainerOps::slots(cudaStream_t stream) {
    if (slot_held_ && held_stream_ != stream) check(cudaStreamWaitEvent(stream, writer_done_.get(), 0), "cudaStreamWaitEvent");
    slot_held_ = false;
    auto *r = result_.get<InspectResult>();
    return {r + slot_, r + (slot_ ^ 1)};
}

unsigned *ContainerOps::arm_post() {
    staging_.host()->posted = 0;
    return &staging_.device()->posted;
}

void ContainerOps::wait_for_post(cudaStream_t stream) {
    const volatile unsigned *posted = &staging_.host()->posted;
    for (;;) {
        // the word is in this CPU's cache until the device's write invalidates it: a thousand
        // reads take about a microsecond; the stream is asked in between, so that a kernel that
        // failed (or a capture, which runs nothing) ends the wait with its error
        for (int i = 0; i < 1024; ++i)
            if (*posted) {
                std::atomic_thread_fence(std::memory_order_acquire);
                return;
            }
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaErrorNotReady) continue;
        check(q, "cudaStreamQuery");
        if (*posted) return;
        fail(TW_STATUS_INTERNAL_ERROR, "the device's verdict was not posted");
    }
}

void ContainerOps::read_back(cudaStream_t stream, void *dst, const void *src, size_t bytes) {
    static_assert(sizeof(InspectResult) <= sizeof(Staging), "a verdict lands in the staging memory");
    if (bytes > sizeof(Staging)) return twblas::cuda::read_back(stream, dst, src, bytes);
    auto *landing = const_cast<Staging *>(staging_.host());
    check(cudaMemcpyAsync(landing->bytes, src, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::memcpy(dst, landing->bytes, bytes);
}

twSpMatInfo_t ContainerOps::info(cudaStream_t stream, const twSpMatDescr &s) {
    require_device_accessible(s.buffer, "descr");
    const Slots r = slots(stream);
    container_info<<<stride_blocks(s.rows), 32 * kWarpsPerBlock, 0, stream>>>(container_args(s), s.format == TW_FORMAT_TWELL,
                                                                         r.use, r.clear, published<InspectResult>());
    check_launch("container_info");
    advance();
    const InspectResult got = read_published<InspectResult>(stream);
    return {static_cast<int64_t>(got.nnz), got.max_row, got.header, 0};
}

const InspectResult *ContainerOps::launch_validation(cudaStream_t stream, const twSpMatDescr &s) {
    const Slots r = slots(stream);
    const ContainerArgs c = container_args(s);
    const bool twell = s.format == TW_FORMAT_TWELL;
    // one launch: the row blocks, then blocks for the record entries / backup slots (at most one
    // per row; the kernel's blocks are kCheckThreads wide)
    const unsigned rows = row_blocks(s.rows);
    const int64_t items = twell ? s.rows : std::min(s.rows, s.hybrid.backup_rows);
    const unsigned items_blocks = flat_blocks(items, kCheckThreads);
    if (twell)
        twell_check<<<rows + items_blocks, kCheckThreads, 0, stream>>>(c, reinterpret_cast<uintptr_t>(s.buffer) % 16 == 0,
                                                                        rows, r.use, r.clear);
    else
        hybrid_check<<<rows + items_blocks, kCheckThreads, 0, stream>>>(c, rows, r.use, r.clear);
    check_launch("container validation");
    advance();
    return r.use;
}

InspectResult ContainerOps::fetch_result(cudaStream_t stream, const InspectResult *result) {
    InspectResult r{};
    read_back(stream, &r, result, sizeof r);
    return r;
}

void ContainerOps::validate(cudaStream_t stream, const twSpMatDescr &s, const char *name) { (void)checked(stream, s, name); }

InspectResult ContainerOps::checked(cudaStream_t stream, const twSpMatDescr &s, const char *name) {
    require_device_accessible(s.buffer, name);
    const InspectResult r = fetch_result(stream, launch_validation(stream, s));
    report(stream, s, name, r);
    return r;
}

void ContainerOps::report(cudaStream_t stream, const twSpMatDescr &s, const char *name, const InspectResult &r) {
    const auto *base = static_cast<const uint8_t *>(s.buffer);
    std::vector<uint8_t> seen(static_cast<size_t>(std::max<int64_t>(s.cols, 1)), 0);
    if (s.format == TW_FORMAT_TWELL) {
        const TwellLayout &l = s.twell;
        const size_t record = l.overflow_offset_words() * 4;
        checks::twell_record_count(l, name, r.header);
        if (r.first_item != kNoItem) {
            const int64_t i = static_cast<int64_t>(r.first_item);
            const auto id = read_one<uint32_t>(stream, base, record + 4 * (1 + i));
            const auto previous = i > 0 ? read_one<uint32_t>(stream, base, record + 4 * i) : 0u;
            checks::twell_record_entry(l, name, i, id, previous);
            checks_disagree("a record entry");
        }
        if (r.first_row != kNoItem) {
            const int64_t row = static_cast<int64_t>(r.first_row >> 1);
            std::vector<uint32_t> words(static_cast<size_t>(l.ld));
            read_back(stream, words.data(), base + l.block(row, 0) * 4, words.size() * 4);
            checks::twell_row(l, name, row, words.data(), (r.first_row & 1) != 0, seen);
            checks_disagree("a row");
        }
        return;
    }
    const HybridLayout &l = s.hybrid;
    const int64_t needed = r.header;
    checks::hybrid_backup_count(l, name, needed);
    if (r.first_item != kNoItem) {
        const int64_t slot = static_cast<int64_t>(r.first_item);
        const int64_t id = read_one<int32_t>(stream, base, l.backup_row_ids + 4 * slot);
        const int64_t map = id >= 0 && id < l.rows ? read_one<int32_t>(stream, base, l.backup_map + 4 * id) : -1;
        checks::hybrid_slot(l, name, slot, id, map);
        checks_disagree("a backup slot");
    }
    if (r.first_row != kNoItem) {
        const int64_t row = static_cast<int64_t>(r.first_row >> 1);
        checks::HybridRow h;
        h.nnz = read_one<int32_t>(stream, base, l.row_nnz + 4 * row);
        h.slot = read_one<int32_t>(stream, base, l.backup_map + 4 * row);
        std::vector<uint16_t> cols(static_cast<size_t>(l.ell_width));
        read_back(stream, cols.data(), base + l.ell_cols + 2 * static_cast<size_t>(row * l.ell_width), cols.size() * 2);
        h.ell_cols = cols.data();
        if (h.nnz > l.ell_width && h.nnz <= l.cols && h.slot >= 0 && h.slot < std::min(needed, l.backup_rows)) {
            h.slot_row_id = read_one<int32_t>(stream, base, l.backup_row_ids + 4 * h.slot);
            std::vector<uint8_t> dense(static_cast<size_t>(l.cols) * l.value_bytes);
            read_back(stream, dense.data(), base + l.backup_vals + static_cast<size_t>(h.slot * l.cols) * l.value_bytes,
                      dense.size());
            for (size_t c = 0; c < static_cast<size_t>(l.cols); ++c) {
                uint32_t bits = 0;
                std::copy_n(dense.data() + c * l.value_bytes, l.value_bytes, reinterpret_cast<uint8_t *>(&bits));
                h.backup_nonzeros += bits != 0;
            }
        }
        checks::hybrid_row(l, name, row, h, needed, seen);
        checks_disagree("a row");
    }
    checks::hybrid_total(name, needed, static_cast<int64_t>(r.over));
}

void ContainerOps::require_complete(cudaStream_t stream, const twSpMatDescr &in) {
    complete_verdict(in, checked(stream, in, "in"));
}

void ContainerOps::complete_verdict(const twSpMatDescr &in, const InspectResult &r) {
    const int64_t lost = in.format == TW_FORMAT_TWELL ? r.header : std::max<int64_t>(0, r.header - in.hybrid.backup_rows);
    checks::complete_input("in", lost);
}

twStatus_t ContainerOps::dense_to_sparse_analysis(cudaStream_t stream, const twDnMatDescr &in, const twSpMatDescr &out,
                                                  twConvertOp_t op) {
    require_device_accessible(in.values, "in");
    const Slots r = slots(stream);
    unsigned long long n = 0;
    if (in.rows > 0 && in.cols > 0) {
        const auto count = dense_rows_vectorizable(matrix_arg(in), out.type) ? count_compact_misses<true>
                                                                              : count_compact_misses<false>;
        count<<<stride_blocks(out.rows), 32 * kWarpsPerBlock, 0, stream>>>(
            matrix_arg(in), op, container_args(out), out.format == TW_FORMAT_TWELL, r.use, r.clear,
            published<InspectResult>());
        check_launch("count_compact_misses");
        advance();
        n = read_published<InspectResult>(stream).nnz;
    }
    checks::dense_to_sparse_capacity(out, static_cast<int64_t>(n));
    return TW_STATUS_SUCCESS;
}

twStatus_t ContainerOps::dense_to_sparse_convert(cudaStream_t stream, const twDnMatDescr &in, const twSpMatDescr &out,
                                                 twConvertOp_t op, void *workspace) {
    require_device_accessible(in.values, "in");
    require_device_accessible(out.buffer, "out");
    require_device_accessible(workspace, "workspace");
    write_sparse(stream, matrix_arg(in), op, out, workspace, {}, published<int32_t>());
    return capacity_status(stream, out);
}

twStatus_t ContainerOps::capacity_status(cudaStream_t stream, const twSpMatDescr &out) {
    if (out.rows == 0) return TW_STATUS_SUCCESS;  // write_empty: the count is 0
    const int64_t needed = read_published<int32_t>(stream);
    const int64_t lost = out.format == TW_FORMAT_TWELL ? static_cast<int64_t>(static_cast<uint32_t>(needed))
                                                       : std::max<int64_t>(0, needed - out.hybrid.backup_rows);
    return lost > 0 ? TW_STATUS_CAPACITY_EXCEEDED : TW_STATUS_SUCCESS;  // the C boundary words the message
}

twStatus_t ContainerOps::sparse_to_dense(cudaStream_t stream, const twSpMatDescr &in, const twDnMatDescr &out) {
    require_device_accessible(in.buffer, "in");
    require_device_accessible(out.values, "out");
    const MatrixArg dense = matrix_arg(out);
    if (in.format == TW_FORMAT_TWELL && !out.empty() && rows_aligned16(dense)) {
        // one pass, each row written once, queued behind the validation, which it obeys on the
        // device: one read-back decides both. A dependent launch: its blocks start while the
        // validation's last ones run and load their first blocks before waiting for the verdict.
        const InspectResult *verdict = launch_validation(stream, in);
        unsigned *posted = arm_post();
        launch_dependent(twell_rows_to_dense, dim3(row_blocks(in.rows)), dim3(32 * kWarpsPerRowBlock), 0, stream, pdl_,
                         "cudaLaunchKernelEx(twell_rows_to_dense)", container_args(in), dense,
                         reinterpret_cast<uintptr_t>(in.buffer) % 16 == 0, verdict, published<InspectResult>(), posted);
        check(cudaEventRecord(writer_done_.get(), stream), "cudaEventRecord");
        // the status is known once the writer's first thread has the verdict: the call returns
        // then, and the rows are written in the stream's order (as cuSPARSE's are), so that the
        // next call's kernels queue while they are
        const InspectResult r = await_posted<InspectResult>(stream);
        if (!valid_and_complete(r)) {
            check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // a refusal: the writer is done
        } else {
            slot_held_ = true;
            held_stream_ = stream;
        }
        report(stream, in, "in", r);
        complete_verdict(in, r);
        return TW_STATUS_SUCCESS;
    }
    require_complete(stream, in);
    if (out.empty()) return TW_STATUS_SUCCESS;
    // any other layout: zero the matrix, then write the values
    const bool row = out.order == TW_ORDER_ROW;
    check(cudaMemset2DAsync(out.values, static_cast<size_t>(out.ld) * elem_bytes(out.type), 0, dense_bytes_of(out),
                            static_cast<size_t>(row ? out.rows : out.cols), stream),
          "cudaMemset2DAsync");
    scatter_to_dense<<<row_blocks(in.rows), 32 * kWarpsPerBlock, 0, stream>>>(container_args(in),
                                                                             in.format == TW_FORMAT_TWELL, matrix_arg(out));
    check_launch("scatter_to_dense");
    return TW_STATUS_SUCCESS;
}

twStatus_t ContainerOps::sparse_convert(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out) {
    require_device_accessible(out.buffer, "out");
    require_complete(stream, in);
    StreamScratch scratch(stream, scratch_pool_.get());
    write_lists(stream, scratch, read_lists(stream, scratch, in), out, published<int32_t>());
    return capacity_status(stream, out);
}

twStatus_t ContainerOps::sparse_transpose(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out) {
    require_device_accessible(out.buffer, "out");
    require_complete(stream, in);
    StreamScratch scratch(stream, scratch_pool_.get());
    write_lists(stream, scratch, transpose_lists(stream, scratch, read_lists(stream, scratch, in), in.cols), out,
                published<int32_t>());
    return capacity_status(stream, out);
}

}  // namespace twblas::cuda
