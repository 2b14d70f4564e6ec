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

/// What the registry knows of an address, for one kind of object.
enum class ObjectState {
    Live,           // a live object of this kind
    LiveOtherKind,  // a live object of another kind
    Destroyed,      // an object of this kind destroyed recently (its storage is in quarantine)
    Unknown         // NULL, foreign, or destroyed longer ago than the quarantine remembers
};
ObjectState registry_state(const void *object, ObjectKind kind);

/// Destroyed objects of each kind whose storage the registry keeps (quarantine). The C handles
/// are bare pointers, so a stale one is only recognisable while no new object can have its
/// address: the storage of the last kQuarantinePerKind destroyed objects of each kind is not
/// returned to the allocator, and their addresses are known as destroyed.
constexpr size_t kQuarantinePerKind = 1024;

/// Takes the storage of a destroyed object (its destructor has run; allocated by plain `new`)
/// into the quarantine of its kind; frees the oldest storage beyond the bound.
void registry_quarantine(void *storage, ObjectKind kind) noexcept;

/// Destroys a live object of `kind`: unregisters it, runs its destructor (releasing everything
/// it owns at once) and quarantines its storage. False, with nothing done, when `object` is not
/// a live object of that kind.
template <class T>
bool registry_destroy(T *object, ObjectKind kind) {
    if (!registry_remove(object, kind)) return false;
    object->~T();
    registry_quarantine(static_cast<void *>(object), kind);
    return true;
}

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
    int32_t save_dense = TW_SAVE_DENSE_AUTO;  // TW_FFN_ATTR_SAVE_DENSE (twSaveDense_t)
    int32_t call_graphs = 1;  // TW_FFN_ATTR_CALL_GRAPHS
    int32_t algorithm = TW_FFN_ALG_DEFAULT;  // TW_FFN_ATTR_ALGORITHM
    float *l1_output = nullptr;             // TW_FFN_ATTR_L1_OUTPUT
    const float *l1_coeff_pointer = nullptr;  // TW_FFN_ATTR_L1_COEFF_POINTER
    std::unique_ptr<twblas::FfnState> state;  // backend-owned: packed weights, stats, counts
    twFfnDescr();
    ~twFfnDescr();
    bool gated() const { return kind == TW_FFN_GATED_RELU; }
};
