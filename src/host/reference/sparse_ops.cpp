// Reference conversions and building blocks (twGemmToSparse, twSpMM).
#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "host/container_checks.hpp"
#include "host/error.hpp"
#include "host/numeric.hpp"
#include "reference.hpp"
#include "sparse_io.hpp"

namespace twblas::reference {

namespace {

/// Raw bits of dense element (r, c): the 16-bit pattern, or the fp32 bits.
ValueBits dense_bits(const twDnMatDescr &m, int64_t r, int64_t c) {
    const size_t i = m.at(r, c);
    if (m.type == TW_R_32F) return static_cast<const uint32_t *>(m.values)[i];
    return static_cast<const uint16_t *>(m.values)[i];
}

void set_dense_bits(const twDnMatDescr &m, int64_t r, int64_t c, ValueBits b) {
    const size_t i = m.at(r, c);
    if (m.type == TW_R_32F)
        static_cast<uint32_t *>(m.values)[i] = b;
    else
        static_cast<uint16_t *>(m.values)[i] = static_cast<uint16_t>(b);
}

/// Which dense values a conversion stores: PLAIN every pattern but +0, RELU values > 0 and NaN.
bool keeps(twConvertOp_t op, twDataType_t type, ValueBits b) {
    if (!is_stored_nonzero(b)) return false;
    if (op == TW_CONVERT_PLAIN) return true;
    const float v = type == TW_R_32F ? bits_float(b) : value_of_bits16(type, static_cast<uint16_t>(b));
    return relu_keeps(v);
}

/// Non-zeros of each dense row as the conversion keeps them.
void dense_row(const twDnMatDescr &in, twConvertOp_t op, int64_t r, std::vector<int32_t> &cols,
               std::vector<ValueBits> &bits) {
    cols.clear();
    bits.clear();
    for (int64_t c = 0; c < in.cols; ++c) {
        const ValueBits b = dense_bits(in, r, c);
        if (keeps(op, in.type, b)) {
            cols.push_back(static_cast<int32_t>(c));
            bits.push_back(b);
        }
    }
}

/// Whether a row with these (sorted) columns fits the container's compact part.
bool fits_compact(const twSpMatDescr &s, const std::vector<int32_t> &cols) {
    if (s.format == TW_FORMAT_HYBRID) return static_cast<int64_t>(cols.size()) <= s.hybrid.ell_width;
    int64_t tile = -1, in_tile = 0;
    for (int32_t c : cols) {
        const int64_t t = c / s.twell.tile_width;
        in_tile = t == tile ? in_tile + 1 : 1;
        tile = t;
        if (in_tile > s.twell.slots) return false;
    }
    return true;
}

size_t container_bytes(const twSpMatDescr &s) {
    return s.format == TW_FORMAT_TWELL ? s.twell.bytes() : s.hybrid.total;
}

void require_disjoint(const twSpMatDescr &a, const twSpMatDescr &b) {
    const auto *pa = static_cast<const uint8_t *>(a.buffer), *pb = static_cast<const uint8_t *>(b.buffer);
    if (pa < pb + container_bytes(b) && pb < pa + container_bytes(a))
        fail(TW_STATUS_INVALID_VALUE, "out: its buffer overlaps the buffer of in");
}

/// Validates a sparse input and refuses one that does not hold all its values (INCOMPLETE_INPUT,
/// before anything is written: CAPACITY_EXCEEDED is kept for an output that is too small).
SparseReader complete_reader(const twSpMatDescr &s, const char *name) {
    validate(s, name);
    SparseReader reader(s);
    checks::complete_input(name, reader.incomplete_rows());
    return reader;
}

twStatus_t finish(const SparseWriter &w) { return w.complete() ? TW_STATUS_SUCCESS : TW_STATUS_CAPACITY_EXCEEDED; }

// Conversion workspace: a stamp written by the analysis and checked by the conversion.
struct AnalysisStamp {
    uint64_t magic;
    int64_t rows, cols;
    int32_t op, format;
    int64_t overflow_rows;
};
constexpr uint64_t kAnalysisMagic = 0x7477616e616c7973ull;  // "twanalys"

}  // namespace

size_t ReferenceBackend::dense_to_sparse_workspace(const twDnMatDescr &, const twSpMatDescr &) {
    return sizeof(AnalysisStamp);
}

twStatus_t ReferenceBackend::dense_to_sparse_analysis(const twDnMatDescr &in, const twSpMatDescr &out,
                                                      twConvertOp_t op, void *workspace) {
    int64_t compact_misses = 0;
    std::vector<int32_t> cols;
    std::vector<ValueBits> bits;
    for (int64_t r = 0; r < in.rows; ++r) {
        dense_row(in, op, r, cols, bits);
        compact_misses += !fits_compact(out, cols);
    }
    const AnalysisStamp stamp{kAnalysisMagic, in.rows, in.cols, op, out.format, compact_misses};
    std::memcpy(workspace, &stamp, sizeof stamp);
    checks::dense_to_sparse_capacity(out, compact_misses);
    return TW_STATUS_SUCCESS;
}

twStatus_t ReferenceBackend::dense_to_sparse_convert(const twDnMatDescr &in, const twSpMatDescr &out,
                                                     twConvertOp_t op, void *workspace) {
    AnalysisStamp stamp;
    std::memcpy(&stamp, workspace, sizeof stamp);
    if (stamp.magic != kAnalysisMagic || stamp.rows != in.rows || stamp.cols != in.cols || stamp.op != op ||
        stamp.format != out.format)
        fail(TW_STATUS_INVALID_VALUE, "workspace: run twDenseToSparse_analysis on it first, with the same in, out and op");
    SparseWriter writer(out);
    std::vector<int32_t> cols;
    std::vector<ValueBits> bits;
    for (int64_t r = 0; r < in.rows; ++r) {
        dense_row(in, op, r, cols, bits);
        writer.write_row(r, cols.data(), bits.data(), static_cast<int64_t>(cols.size()));
    }
    return finish(writer);
}

twStatus_t ReferenceBackend::sparse_to_dense(const twSpMatDescr &in, const twDnMatDescr &out) {
    const SparseReader reader = complete_reader(in, "in");
#pragma omp parallel
    {
        std::vector<int32_t> cols;
        std::vector<ValueBits> bits;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < in.rows; ++r) {
            for (int64_t c = 0; c < in.cols; ++c) set_dense_bits(out, r, c, 0);
            cols.clear();
            bits.clear();
            reader.row(r, cols, bits);
            for (size_t i = 0; i < cols.size(); ++i) set_dense_bits(out, r, cols[i], bits[i]);
        }
    }
    return TW_STATUS_SUCCESS;
}

twStatus_t ReferenceBackend::sparse_convert(const twSpMatDescr &in, const twSpMatDescr &out) {
    require_disjoint(in, out);
    const SparseReader reader = complete_reader(in, "in");
    SparseWriter writer(out);
    std::vector<int32_t> cols;
    std::vector<ValueBits> bits;
    for (int64_t r = 0; r < in.rows; ++r) {
        cols.clear();
        bits.clear();
        reader.row(r, cols, bits);
        writer.write_row(r, cols.data(), bits.data(), static_cast<int64_t>(cols.size()));
    }
    return finish(writer);
}

twStatus_t ReferenceBackend::sparse_transpose(const twSpMatDescr &in, const twSpMatDescr &out) {
    require_disjoint(in, out);
    const SparseReader reader = complete_reader(in, "in");
    // Bucket entries by column; rows are visited in ascending order, so each bucket is sorted.
    std::vector<std::vector<int32_t>> t_cols(static_cast<size_t>(in.cols));
    std::vector<std::vector<ValueBits>> t_bits(static_cast<size_t>(in.cols));
    std::vector<int32_t> cols;
    std::vector<ValueBits> bits;
    for (int64_t r = 0; r < in.rows; ++r) {
        cols.clear();
        bits.clear();
        reader.row(r, cols, bits);
        for (size_t i = 0; i < cols.size(); ++i) {
            t_cols[cols[i]].push_back(static_cast<int32_t>(r));
            t_bits[cols[i]].push_back(bits[i]);
        }
    }
    SparseWriter writer(out);
    for (int64_t c = 0; c < in.cols; ++c)
        writer.write_row(c, t_cols[c].data(), t_bits[c].data(), static_cast<int64_t>(t_cols[c].size()));
    return finish(writer);
}

size_t ReferenceBackend::gemm_to_sparse_workspace(const twDnMatDescr &, const twDnMatDescr &, const twSpMatDescr &) {
    return 0;
}

void ReferenceBackend::gemm_to_sparse(float alpha, const twDnMatDescr &a, const twDnMatDescr &b,
                                      const twSpMatDescr &c, twConvertOp_t act, void *) {
    const RowMatrix bf = load(b);
    SparseWriter writer(c);
    const int64_t n = b.rows;
    std::vector<std::vector<int32_t>> cols(kRowBlock);
    std::vector<std::vector<ValueBits>> bits(kRowBlock);
    for (int64_t r0 = 0; r0 < a.rows; r0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, a.rows - r0);
        RowMatrix z(rows, n);
        z.noalias() = load_rows(a, r0, rows) * bf.transpose();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < rows; ++i) {
            cols[i].clear();
            bits[i].clear();
            for (int64_t j = 0; j < n; ++j) {
                const ValueBits bj = to_bits(c.type, alpha * z(i, j));
                if (keeps(act, c.type, bj)) {
                    cols[i].push_back(static_cast<int32_t>(j));
                    bits[i].push_back(bj);
                }
            }
        }
        for (int64_t i = 0; i < rows; ++i)
            writer.write_row(r0 + i, cols[i].data(), bits[i].data(), static_cast<int64_t>(cols[i].size()));
    }
}

size_t ReferenceBackend::spmm_workspace(const twSpMatDescr &, const twDnMatDescr &, const twDnMatDescr &) { return 0; }

twStatus_t ReferenceBackend::spmm(float alpha, const twSpMatDescr &s, const twDnMatDescr &w, float beta,
                                  const twDnMatDescr &y, void *) {
    const SparseReader reader = complete_reader(s, "S");
    const RowMatrix wf = load(w);
    const int64_t n = w.cols;
#pragma omp parallel
    {
        std::vector<int32_t> cols;
        std::vector<ValueBits> bits;
        std::vector<float> acc(static_cast<size_t>(n));
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < s.rows; ++r) {
            cols.clear();
            bits.clear();
            reader.row(r, cols, bits);
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (size_t i = 0; i < cols.size(); ++i) {
                const float v = reader.value(bits[i]);
                const float *wr = wf.row(cols[i]).data();
                for (int64_t c = 0; c < n; ++c) acc[c] += v * wr[c];
            }
            for (int64_t c = 0; c < n; ++c) {
                float out = alpha * acc[c];
                if (beta != 0.0f) out += beta * load_value(y.values, y.at(r, c), y.type);
                acc[c] = out;
            }
            store_row(y, r, acc.data());
        }
    }
    return TW_STATUS_SUCCESS;
}

}  // namespace twblas::reference
