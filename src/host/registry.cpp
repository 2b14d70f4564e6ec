#include <deque>
#include <mutex>
#include <new>
#include <unordered_map>

#include "objects.hpp"

namespace twblas {
namespace {

constexpr int kKinds = 4;

// The one process-wide structure in twblas: addresses of live objects, so that a destroyed or
// foreign pointer is recognised without being dereferenced, and the quarantine of recently
// destroyed objects (their storage, kept so that no new object can take their address). It
// carries no settings.
struct Registry {
    std::mutex mutex;
    std::unordered_map<const void *, ObjectKind> live;
    std::unordered_map<const void *, ObjectKind> destroyed;
    std::deque<void *> quarantine[kKinds];  // oldest first
};

Registry &registry() {
    static Registry *r = new Registry;  // never destroyed: safe to use from static destructors
    return *r;
}

}  // namespace

const char *object_kind_name(ObjectKind kind) {
    switch (kind) {
        case ObjectKind::Handle: return "handle";
        case ObjectKind::DnMat: return "dense matrix descriptor";
        case ObjectKind::SpMat: return "sparse matrix descriptor";
        case ObjectKind::Ffn: return "FFN descriptor";
    }
    return "object";
}

void registry_add(const void *object, ObjectKind kind) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.live[object] = kind;
    r.destroyed.erase(object);  // cannot be there (quarantined storage is never reused); kept exact
}

bool registry_remove(const void *object, ObjectKind kind) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.live.find(object);
    if (it == r.live.end() || it->second != kind) return false;
    r.live.erase(it);
    return true;
}

bool registry_contains(const void *object, ObjectKind kind) {
    if (object == nullptr) return false;
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.live.find(object);
    return it != r.live.end() && it->second == kind;
}

ObjectState registry_state(const void *object, ObjectKind kind) {
    if (object == nullptr) return ObjectState::Unknown;
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.live.find(object);
    if (it != r.live.end()) return it->second == kind ? ObjectState::Live : ObjectState::LiveOtherKind;
    auto d = r.destroyed.find(object);
    return d != r.destroyed.end() && d->second == kind ? ObjectState::Destroyed : ObjectState::Unknown;
}

void registry_quarantine(void *storage, ObjectKind kind) noexcept {
    Registry &r = registry();
    void *evicted = nullptr;
    try {
        std::lock_guard<std::mutex> lock(r.mutex);
        std::deque<void *> &q = r.quarantine[static_cast<int>(kind)];
        q.push_back(storage);
        try {
            r.destroyed[storage] = kind;
        } catch (...) {
            q.pop_back();
            throw;
        }
        if (q.size() > kQuarantinePerKind) {
            evicted = q.front();
            q.pop_front();
            r.destroyed.erase(evicted);
        }
    } catch (...) {  // no memory for the bookkeeping: release the storage at once
        evicted = storage;
    }
    ::operator delete(evicted);  // outside the lock; NULL is a no-op
}

}  // namespace twblas
