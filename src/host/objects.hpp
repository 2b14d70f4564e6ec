// The opaque objects behind the C handles and descriptors, and the registry that tells live
// objects from NULL, destroyed or foreign pointers without ever dereferencing them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "formats.hpp"
#include "twblas/twblas.h"

namespace twblas {

class Backend;
struct FfnState;

enum class ObjectKind { Handle, DnMat, SpMat, Ffn };
const char *object_kind_name(ObjectKind kind);

/// Live-object bookkeeping. Every create registers, every destroy unregisters, every use
/// checks, so a stale pointer gives TW_STATUS_NOT_INITIALIZED instead of a use-after-free.
/// It holds addresses only (no settings, no shared state between handles); a mutex guards it.
void registry_add(const void *object, ObjectKind kind);
bool registry_remove(const void *object, ObjectKind kind);
bool registry_contains(const void *object, ObjectKind kind);

}  // namespace twblas

struct twContext {
    twBackend_t backend = TW_BACKEND_CPU;
    void *stream = nullptr;
    std::string last_error;
    std::unique_ptr<twblas::Backend> impl;
    twContext();
    ~twContext();
};

struct twDnMatDescr {
    int64_t rows = 0, cols = 0, ld = 0;
    void *values = nullptr;
    twDataType_t type = TW_R_32F;
    twOrder_t order = TW_ORDER_ROW;

    /// Element offset of logical (r, c).
    size_t at(int64_t r, int64_t c) const {
        return static_cast<size_t>(order == TW_ORDER_ROW ? r * ld + c : c * ld + r);
    }
    bool empty() const { return rows == 0 || cols == 0; }
};

struct twSpMatDescr {
    twFormat_t format = TW_FORMAT_TWELL;
    int64_t rows = 0, cols = 0;
    twDataType_t type = TW_R_16BF;
    void *buffer = nullptr;
    twblas::TwellLayout twell;    // valid when format == TW_FORMAT_TWELL
    twblas::HybridLayout hybrid;  // valid when format == TW_FORMAT_HYBRID
};

struct twFfnDescr {
    twFfnKind_t kind = TW_FFN_GATED_RELU;
    int64_t model_dim = 0;   // D
    int64_t hidden_dim = 0;  // H
    twDataType_t type = TW_R_16BF;
    twBackend_t backend = TW_BACKEND_CPU;
    int32_t tile_width = 256;
    int32_t compression = 8;
    int32_t compute_mode = TW_COMPUTE_DEFAULT;
    int32_t deterministic = 0;
    std::unique_ptr<twblas::FfnState> state;  // backend-owned: packed weights, stats, counts
    twFfnDescr();
    ~twFfnDescr();
    bool gated() const { return kind == TW_FFN_GATED_RELU; }
};
