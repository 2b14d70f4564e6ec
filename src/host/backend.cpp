// Default implementations of the Backend interface (backend.hpp).
#include "backend.hpp"

#include <cstring>

#include "error.hpp"
#include "numeric.hpp"

namespace twblas {

void Backend::fill_zero(const twDnMatDescr &m) {
    if (kind() != TW_BACKEND_CPU)
        fail(TW_STATUS_NOT_SUPPORTED, "this backend does not implement Backend::fill_zero (zero weight gradients "
                                      "of a backward over no tokens)");
    if (m.empty()) return;
    const size_t esize = value_size(m.type);
    const int64_t lines = m.order == TW_ORDER_ROW ? m.rows : m.cols;
    const size_t inner = static_cast<size_t>(m.order == TW_ORDER_ROW ? m.cols : m.rows) * esize;
    auto *base = static_cast<unsigned char *>(m.values);
    for (int64_t l = 0; l < lines; ++l)  // +0 is the all-zero pattern in every value type
        std::memset(base + static_cast<size_t>(l) * static_cast<size_t>(m.ld) * esize, 0, inner);
}

}  // namespace twblas
