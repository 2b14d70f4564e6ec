// Dense helpers and the container queries of the reference backend.
#include "reference.hpp"
#include "sparse_io.hpp"

#include "host/numeric.hpp"

namespace twblas {

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<reference::ReferenceBackend>(); }

namespace reference {

RowMatrix load_rows(const twDnMatDescr &m, int64_t r0, int64_t n) {
    RowMatrix out(n, m.cols);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < m.cols; ++c) out(i, c) = load_value(m.values, m.at(r0 + i, c), m.type);
    return out;
}

void store_row(const twDnMatDescr &m, int64_t r, const float *src) {
    for (int64_t c = 0; c < m.cols; ++c) store_value(m.values, m.at(r, c), m.type, src[c]);
}

void store(const twDnMatDescr &m, const RowMatrix &src) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < m.rows; ++r) store_row(m, r, src.row(r).data());
}

twSpMatInfo_t ReferenceBackend::sparse_info(const twSpMatDescr &s) { return info(s); }
void ReferenceBackend::sparse_validate(const twSpMatDescr &s) { validate(s, "descr"); }

}  // namespace reference
}  // namespace twblas
