#include <mutex>
#include <unordered_map>

#include "objects.hpp"

namespace twblas {
namespace {

// The one process-wide structure in twblas: addresses of live objects, so that a destroyed or
// foreign pointer is recognised without being dereferenced. It carries no settings.
struct Registry {
    std::mutex mutex;
    std::unordered_map<const void *, ObjectKind> live;
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

}  // namespace twblas
