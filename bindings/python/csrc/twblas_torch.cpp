// twblas's PyTorch ops, registered from C++ (TORCH_LIBRARY(twblas)) and loaded by twblas.torch with
// torch.ops.load_library: a plain shared library (libtorch and libtwblas, no Python ABI).
//
//   twblas::sparse_ffn(x, w_gate?, w_up, w_down, save_dense=None) -> (y, l1)
//       what an eager call runs (CompositeImplicitAutograd): training = grad mode and an input
//       that requires grad; then ffn_forward through the dispatcher
//   twblas::ffn_forward(x, w_gate?, w_up, w_down, training, save_dense) -> (y, l1, saved)
//       save_dense: TW_FFN_ATTR_SAVE_DENSE, None AUTO (the library's choice), True ALWAYS, False NEVER
//       saved: the C API's saved state when training (always when autograd records the call)
//       CPU and CUDA kernels; its autograd (a torch::autograd::Function) is registered for the
//       Autograd key and calls ffn_backward
//   twblas::ffn_backward(x, w_gate?, w_up, w_down, saved, dy, dl1) -> (dx, dw_gate_up, dw_down)
//       dw_gate_up: [dWg; dWu] (2H x D) when gated, else dWu: one output, so that a stacked pair
//       of weights gets its gradients from one GEMM (the autograd splits it into two views)
//   twblas::ffn_stats(w_gate?, w_up, w_down) -> float[]   (twFfnGetStats: blocks)
//   twblas::ffn_neuron_counts(w_gate?, w_up, w_down, reset=False) -> Tensor
//   twblas::ffn_weight_copy_bytes(w_gate?, w_up, w_down) -> int   (TW_FFN_ATTR_WEIGHT_COPY_BYTES)
//   twblas::ffn_deterministic(w_gate?, w_up, w_down) -> bool      (TW_FFN_ATTR_DETERMINISTIC)
//   twblas::_cache_info() -> int[]   (FFN descriptors held, made and re-pointed so far: for the tests)
//
// Weights use nn.Linear's layouts: w_gate, w_up (H, D), w_down (D, H); x (..., D). The fake
// (meta) kernels for torch.compile are registered in Python (twblas/torch.py).
//
// How a call runs (the rules of include/twblas/twblas.h):
//  - one twblas handle per thread and device (a handle is used by one thread at a time), on
//    torch's current CUDA stream of the tensors' device (twSetStream only when it changed); the
//    stream comes from c10's device-guard interface (the same getCurrentCUDAStream), so the
//    library needs no CUDA header and one build serves CPU-only and CUDA torch alike;
//  - FFN descriptors are cached here and shared by every thread (autograd runs a CUDA backward
//    on a thread of its own, and that backward must find the descriptor its forward used: it
//    knows whether the forward ran in dense mode and kept g and u). The key is the weights'
//    memory: data_ptr, shape, strides, dtype, device; an entry also holds weak references to
//    the weights' TensorImpl and StorageImpl, so that other tensors that took the memory of freed
//    weights never meet a stale entry; the same tensors in moved memory (FSDP2 re-allocates a
//    parameter's storage each step) re-point their entry (twFfnUpdateWeights) instead of making
//    a new descriptor. Each descriptor has a lock held around every use (its
//    pointer attributes are set per call; twFfnSetAttribute and twFfnUpdateWeights must not run
//    while other calls use it);
//  - a descriptor that holds a copy of some weight (TW_FFN_ATTR_WEIGHT_COPY_BYTES > 0, or a
//    library without that attribute) is refreshed with twFfnUpdateWeights, on the current
//    stream, before every call (a version counter does not see every write: FSDP2's all-gather
//    into the same storage); weights read in place need nothing;
//  - dense descriptors are made per call (cheap in C); workspaces and the saved state come from
//    torch's allocator (at::empty); nothing is read back and nothing synchronises: l1 is written
//    by the library into its tensor (TW_FFN_ATTR_L1_OUTPUT) and the backward reads l1's gradient
//    from its tensor (TW_FFN_ATTR_L1_COEFF_POINTER), in stream order, so calls can be captured
//    in a CUDA graph once the descriptor exists (its first call makes it: twCreateFfn may
//    allocate and block);
//  - a status other than SUCCESS becomes an exception carrying the library's message
//    (twGetErrorMessage): ValueError for INVALID_VALUE, RuntimeError otherwise.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/version.h>

#include <twblas/twblas.h>

#include <atomic>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// TW_FFN_ATTR_WEIGHT_COPY_BYTES (int64, read-only). By number, so that this file builds against
// headers from before it; an older library answers INVALID_VALUE, read as "keeps a copy".
constexpr int kAttrWeightCopyBytes = 8;
// FFN descriptors kept (least recently used out first); entries whose weights are gone are
// dropped whenever a descriptor is made
constexpr size_t kMaxFfns = 1024;

// ---------------------------------------------------------------------------------------------
// errors

[[noreturn]] void fail(twStatus_t status, twHandle_t h, const char* what) {
    const char* detail = twGetErrorMessage(h);
    std::string msg = std::string("twblas: ") + what + ": " + twGetStatusName(status);
    if (detail && *detail) {
        msg += ": ";
        msg += detail;
    }
    if (status == TW_STATUS_INVALID_VALUE) TORCH_CHECK_VALUE(false, msg);
    TORCH_CHECK(false, msg);
}

inline void check(twStatus_t status, twHandle_t h, const char* what) {
    if (status != TW_STATUS_SUCCESS) fail(status, h, what);
}

// ---------------------------------------------------------------------------------------------
// layouts and dense descriptors

twDataType_t tw_type(at::ScalarType t) {
    switch (t) {
        case at::kFloat: return TW_R_32F;
        case at::kHalf: return TW_R_16F;
        case at::kBFloat16: return TW_R_16BF;
        default: TORCH_CHECK_VALUE(false, "twblas: unsupported dtype ", t);
    }
    return TW_R_32F;  // not reached
}

struct Layout {
    int64_t rows, cols, ld;
    twOrder_t order;
};

// a (rows, cols) tensor that the C API can read as row-major: unit column stride, ld >= cols
bool row_major(const Tensor& t) {
    const int64_t r = t.size(0), c = t.size(1);
    return (c <= 1 || t.stride(1) == 1) && (r <= 1 || t.stride(0) >= std::max<int64_t>(c, 1));
}

Layout rows_layout(const Tensor& t) {
    const int64_t r = t.size(0), c = t.size(1);
    return {r, c, r > 1 ? t.stride(0) : std::max<int64_t>(c, 1), TW_ORDER_ROW};
}

// w_down (D, H) with strides (1, >= D): a transposed view of an H x D row-major storage, the
// layout the CUDA kernels read in place (SparseMLP keeps down_proj.weight so)
bool down_in_place(const Tensor& w) {
    const int64_t d = w.size(0), h = w.size(1);
    return (d <= 1 || w.stride(0) == 1) && (h <= 1 || w.stride(1) >= std::max<int64_t>(d, 1));
}

// the C API's Wd (logical H x D) for nn.Linear's down_proj.weight (D, H): TW_ORDER_ROW with ld
// stride(1) in the in-place layout, else TW_ORDER_COL with ld stride(0) (a row-major (D, H))
Layout down_layout(const Tensor& w) {
    const int64_t d = w.size(0), h = w.size(1);
    if (down_in_place(w)) return {h, d, h > 1 ? w.stride(1) : std::max<int64_t>(d, 1), TW_ORDER_ROW};
    return {h, d, d > 1 ? w.stride(0) : std::max<int64_t>(h, 1), TW_ORDER_COL};
}

class DnMat {
  public:
    DnMat() = default;
    DnMat(const Tensor& t, const Layout& l) {
        void* data = t.numel() > 0 ? t.data_ptr() : nullptr;
        check(twCreateDnMat(&d_, l.rows, l.cols, l.ld, data, tw_type(t.scalar_type()), l.order), nullptr,
              "twCreateDnMat");
    }
    DnMat(const DnMat&) = delete;
    DnMat& operator=(const DnMat&) = delete;
    DnMat(DnMat&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
    DnMat& operator=(DnMat&& o) noexcept {
        std::swap(d_, o.d_);
        return *this;
    }
    ~DnMat() {
        if (d_) twDestroyDnMat(d_);
    }
    twDnMatDescr_t get() const { return d_; }

  private:
    twDnMatDescr_t d_ = nullptr;
};

DnMat rows_of(const Tensor& t) { return DnMat(t, rows_layout(t)); }
DnMat down_of(const Tensor& t) { return DnMat(t, down_layout(t)); }

// ---------------------------------------------------------------------------------------------
// checks (ValueError, with the messages of the former Python checks)

void check_tensor(const char* name, const Tensor& t, const Tensor& ref, const char* ref_name) {
    TORCH_CHECK_VALUE(t.defined(), "twblas: ", name, " must be a tensor");
    const auto st = t.scalar_type();
    TORCH_CHECK_VALUE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, "twblas: ", name,
                      " has dtype ", st, "; float32, float16 or bfloat16 expected");
    TORCH_CHECK_VALUE(t.device() == ref.device(), "twblas: ", name, " is on ", t.device(), ", ", ref_name, " on ",
                      ref.device(), ": all on one device");
    TORCH_CHECK_VALUE(st == ref.scalar_type(), "twblas: ", name, " has dtype ", st, ", ", ref_name, " ",
                      ref.scalar_type(), ": one dtype for all");
}

bool gated_of(const OptTensor& w_gate) { return w_gate.has_value() && w_gate->defined(); }

void check_weights(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    TORCH_CHECK_VALUE(w_up.defined(), "twblas: w_up must be a tensor");
    check_tensor("w_up", w_up, w_up, "w_up");
    check_tensor("w_down", w_down, w_up, "w_up");
    if (gated_of(w_gate)) check_tensor("w_gate", *w_gate, w_up, "w_up");
    const auto dev = w_up.device();
    TORCH_CHECK_VALUE(dev.is_cpu() || dev.is_cuda(), "twblas: tensors on ", dev,
                      " are not supported (CPU or CUDA)");
    TORCH_CHECK_VALUE(w_up.dim() == 2 && w_down.dim() == 2, "twblas: w_up must be (H, D) and w_down (D, H)");
    const int64_t h = w_up.size(0), d = w_up.size(1);
    TORCH_CHECK_VALUE(w_down.size(0) == d && w_down.size(1) == h, "twblas: w_down must be (D, H) = (", d, ", ", h,
                      "), got ", w_down.sizes());
    if (gated_of(w_gate))
        TORCH_CHECK_VALUE(w_gate->dim() == 2 && w_gate->size(0) == h && w_gate->size(1) == d,
                          "twblas: w_gate must be (H, D) = (", h, ", ", d, "), got ", w_gate->sizes());
}

void check_inputs(const Tensor& x, const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    TORCH_CHECK_VALUE(x.defined(), "twblas: x must be a tensor");
    check_tensor("x", x, x, "x");
    TORCH_CHECK_VALUE(w_up.defined(), "twblas: w_up must be a tensor");
    check_tensor("w_up", w_up, x, "x");
    TORCH_CHECK_VALUE(w_down.defined(), "twblas: w_down must be a tensor");
    check_tensor("w_down", w_down, x, "x");
    if (gated_of(w_gate)) check_tensor("w_gate", *w_gate, x, "x");
    TORCH_CHECK_VALUE(x.dim() >= 1, "twblas: x must have shape (..., D)");
    TORCH_CHECK_VALUE(w_up.dim() == 2 && w_down.dim() == 2, "twblas: w_up must be (H, D) and w_down (D, H)");
    TORCH_CHECK_VALUE(x.size(-1) == w_up.size(1), "twblas: x has D = ", x.size(-1), ", w_up is (H, D) = ",
                      w_up.sizes());
    check_weights(w_gate, w_up, w_down);
}

// tokens: the product of x's leading dimensions
int64_t tokens_of(const Tensor& x) {
    int64_t m = 1;
    for (int64_t i = 0; i + 1 < x.dim(); ++i) m *= x.size(i);
    return m;
}

// x (..., D) as a row-major (M, D) matrix (a view where one exists)
Tensor as_rows(const Tensor& x, int64_t m, int64_t d) {
    Tensor x2 = x.reshape({m, d});
    return row_major(x2) ? x2 : x2.contiguous();
}

// ---------------------------------------------------------------------------------------------
// handles: one per thread and device

struct Handle {
    twHandle_t h = nullptr;
    void* stream = nullptr;
    bool stream_set = false;
    Handle() = default;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() {
        if (h) twDestroy(h);
    }
};

// the handle of this thread for `dev`, set to torch's current stream of that device
twHandle_t handle_for(const c10::Device& dev) {
    thread_local std::unordered_map<int, Handle> handles;  // device index, -1 for the CPU
    const bool cuda = dev.is_cuda();
    Handle& hd = handles[cuda ? dev.index() : -1];
    if (!hd.h) {
        twHandle_t h = nullptr;
        if (cuda) {
            c10::DeviceGuard guard(dev);  // a CUDA handle belongs to the device current at its creation
            check(twCreateWithBackend(&h, TW_BACKEND_CUDA), nullptr, "twCreateWithBackend");
        } else {
            check(twCreateWithBackend(&h, TW_BACKEND_CPU), nullptr, "twCreateWithBackend");
        }
        hd.h = h;
    }
    if (cuda) {
        void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev).native_handle();
        if (!hd.stream_set || stream != hd.stream) {
            check(twSetStream(hd.h, stream), hd.h, "twSetStream");
            hd.stream = stream;
            hd.stream_set = true;
        }
    }
    return hd.h;
}

// ---------------------------------------------------------------------------------------------
// FFN descriptors, shared by all threads

// the weights as the C API reads them: rows with unit stride (nn.Linear's weights are already),
// w_down in either of its two layouts; anything else is a contiguous copy
struct Weights {
    Tensor w[3];  // gate (undefined for a plain FFN), up, down
    bool gated = false;
};

Weights weights_of(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    Weights ws;
    ws.gated = gated_of(w_gate);
    if (ws.gated) ws.w[0] = row_major(*w_gate) ? *w_gate : w_gate->contiguous();
    ws.w[1] = row_major(w_up) ? w_up : w_up.contiguous();
    ws.w[2] = (down_in_place(w_down) || row_major(w_down)) ? w_down : w_down.contiguous();
    return ws;
}


struct Key {  // no padding: compared and hashed as bytes
    void* ptr[3];
    int64_t dims[3][4];  // sizes and strides
    int64_t meta[4];     // dtype, device type, device index, gated

    bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};

static_assert(sizeof(Key) == sizeof(void*) * 3 + sizeof(int64_t) * 16 && sizeof(Key) % 8 == 0, "Key has padding");

struct KeyHash {
    size_t operator()(const Key& k) const {
        uint64_t words[sizeof(Key) / 8];
        std::memcpy(words, &k, sizeof words);
        uint64_t h = 1469598103934665603ull;  // FNV-1a over 64-bit words
        for (uint64_t w : words) h = (h ^ w) * 1099511628211ull;
        return static_cast<size_t>(h ^ (h >> 29));
    }
};

Key key_of(const Weights& ws) {
    Key k;
    std::memset(&k, 0, sizeof k);
    for (int i = 0; i < 3; ++i) {
        const Tensor& w = ws.w[i];
        if (!w.defined()) continue;
        k.ptr[i] = w.data_ptr();
        k.dims[i][0] = w.size(0);
        k.dims[i][1] = w.size(1);
        k.dims[i][2] = w.stride(0);
        k.dims[i][3] = w.stride(1);
    }
    const Tensor& up = ws.w[1];
    k.meta[0] = static_cast<int64_t>(up.scalar_type());
    k.meta[1] = static_cast<int64_t>(up.device().type());
    k.meta[2] = up.device().index();
    k.meta[3] = ws.gated;
    return k;
}

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

class Ffn {
  public:
    std::mutex mu;  // held around every use

    Ffn(twHandle_t h, const Weights& ws) : gated_(ws.gated) {
        for (int i = 0; i < 3; ++i) {
            const Tensor& w = ws.w[i];
            if (!w.defined()) continue;
            impls_[i].emplace(w.getIntrusivePtr());
            storages_[i].emplace(w.storage().getWeakStorageImpl());
            memory_[i] = w.storage().data_ptr().get();
            descr_[i] = i == 2 ? down_of(w) : rows_of(w);
        }
        check(twCreateFfn(h, &d_, gated_ ? TW_FFN_GATED_RELU : TW_FFN_RELU, descr_[0].get(), descr_[1].get(),
                          descr_[2].get()),
              h, "twCreateFfn");
        int64_t bytes = 1;
        if (twFfnGetAttribute(d_, static_cast<twFfnAttribute_t>(kAttrWeightCopyBytes), &bytes, sizeof bytes) ==
            TW_STATUS_SUCCESS)
            keeps_copy_ = bytes != 0;
    }
    Ffn(const Ffn&) = delete;
    Ffn& operator=(const Ffn&) = delete;
    ~Ffn() {
        if (d_) twDestroyFfn(d_);
    }

    twFfnDescr_t get() const { return d_; }
    bool keeps_copy() const { return keeps_copy_; }

    // the same tensors (and memory) as at creation
    bool same(const Weights& ws) const {
        for (int i = 0; i < 3; ++i) {
            if (!ws.w[i].defined()) continue;
            if (!impls_[i] || impls_[i]->_unsafe_get_target() != ws.w[i].unsafeGetTensorImpl() ||
                storages_[i]->_unsafe_get_target() != ws.w[i].storage().unsafeGetStorageImpl())
                return false;
        }
        return true;
    }

    // the same tensors and storages as at creation, but some storage's memory moved (FSDP2 frees
    // a parameter's storage after use and re-allocates it for the next step)
    bool moved(const Weights& ws) const {
        bool any = false;
        for (int i = 0; i < 3; ++i) {
            if (ws.w[i].defined() != impls_[i].has_value()) return false;
            if (!ws.w[i].defined()) continue;
            if (impls_[i]->expired() || impls_[i]->_unsafe_get_target() != ws.w[i].unsafeGetTensorImpl() ||
                storages_[i]->_unsafe_get_target() != ws.w[i].storage().unsafeGetStorageImpl())
                return false;
            any = any || ws.w[i].storage().data_ptr().get() != memory_[i];
        }
        return any;
    }

    // with `mu` held: the descriptor pointed at the weights' new memory (twFfnUpdateWeights:
    // host state only for weights read in place; its captured calls follow), instead of a new
    // descriptor, which would allocate, block and start the path choice's statistics over
    void repoint(twHandle_t h, const Weights& ws) {
        DnMat fresh[3];
        for (int i = 0; i < 3; ++i)
            if (ws.w[i].defined()) fresh[i] = i == 2 ? down_of(ws.w[i]) : rows_of(ws.w[i]);
        check(twFfnUpdateWeights(h, d_, fresh[0].get(), fresh[1].get(), fresh[2].get()), h, "twFfnUpdateWeights");
        for (int i = 0; i < 3; ++i) {
            if (!ws.w[i].defined()) continue;
            descr_[i] = std::move(fresh[i]);
            memory_[i] = ws.w[i].storage().data_ptr().get();
        }
        int64_t bytes = 1;
        if (twFfnGetAttribute(d_, static_cast<twFfnAttribute_t>(kAttrWeightCopyBytes), &bytes, sizeof bytes) ==
            TW_STATUS_SUCCESS)
            keeps_copy_ = bytes != 0;
    }

    // false once a weight is freed, or its storage moved to other memory (FSDP2 frees and
    // re-allocates the same storage every step): nothing can use this descriptor again, and
    // keeping it would keep its copy of the weights
    bool alive() const {
        for (int i = 0; i < 3; ++i) {
            if (!impls_[i]) continue;
            if (impls_[i]->expired()) return false;
            const c10::intrusive_ptr<c10::StorageImpl> s = storages_[i]->lock();
            if (!s || s->data_ptr().get() != memory_[i]) return false;
        }
        return true;
    }

    // with `mu` held: a copy re-read (twFfnUpdateWeights, on h's stream, in stream order) before
    // every call. Not only when a version counter moved: FSDP2 all-gathers new values into the
    // same storage without one, and a stale copy would silently use last step's weights. Weights
    // read in place (the layouts SparseMLP keeps) cost nothing here.
    void sync_weights(twHandle_t h, const Weights&) {
        if (!keeps_copy_) return;
        check(twFfnUpdateWeights(h, d_, descr_[0].get(), descr_[1].get(), descr_[2].get()), h,
              "twFfnUpdateWeights");
    }

    // with `mu` held: TW_FFN_ATTR_SAVE_DENSE, set when it changes: None is the library's choice
    // (AUTO: room for z and u when the step will run in dense mode), True ALWAYS, False NEVER
    void set_save_dense(std::optional<bool> choice) {
        const int32_t mode = !choice ? TW_SAVE_DENSE_AUTO : *choice ? TW_SAVE_DENSE_ALWAYS : TW_SAVE_DENSE_NEVER;
        if (mode == save_dense_) return;
        check(twFfnSetAttribute(d_, TW_FFN_ATTR_SAVE_DENSE, &mode, sizeof mode), nullptr, "twFfnSetAttribute");
        save_dense_ = mode;
    }

    // with `mu` held: TW_FFN_ATTR_DETERMINISTIC as torch.use_deterministic_algorithms() has it,
    // set when it changes: the same bits run to run when torch asks for them (the library's
    // default also runs paths that sum in whatever order the GPU reaches the terms)
    void set_deterministic(bool on) {
        const int32_t v = on ? 1 : 0;
        if (v == deterministic_) return;
        check(twFfnSetAttribute(d_, TW_FFN_ATTR_DETERMINISTIC, &v, sizeof v), nullptr, "twFfnSetAttribute");
        deterministic_ = v;
    }

    // with `mu` held: a pointer attribute (L1_OUTPUT, L1_COEFF_POINTER) at `p` for the next call.
    // It stays set afterwards; every call that reads or writes it sets it first, under the lock.
    void point(twFfnAttribute_t attr, void* p) {
        void*& last = attr == TW_FFN_ATTR_L1_OUTPUT ? l1_output_ : l1_coeff_;
        if (p == last) return;
        check(twFfnSetAttribute(d_, attr, &p, sizeof p), nullptr, "twFfnSetAttribute");
        last = p;
    }

  private:
    twFfnDescr_t d_ = nullptr;
    bool gated_;
    bool keeps_copy_ = true;
    int32_t save_dense_ = TW_SAVE_DENSE_AUTO;  // the attribute's default
    int32_t deterministic_ = 0;                // likewise
    void* l1_output_ = nullptr;
    void* l1_coeff_ = nullptr;
    std::optional<WeakImpl> impls_[3];
    std::optional<WeakStorage> storages_[3];
    const void* memory_[3] = {nullptr, nullptr, nullptr};  // each storage's memory at creation
    DnMat descr_[3];  // what twCreateFfn was given (twFfnUpdateWeights takes them again)
};

class FfnCache {
  public:
    // the descriptor of `ws` (made on first use), not yet locked
    std::shared_ptr<Ffn> get(twHandle_t h, const Weights& ws) {
        const Key k = key_of(ws);
        std::lock_guard<std::mutex> lock(mu_);
        auto it = map_.find(k);
        if (it != map_.end()) {
            if (it->second->second->same(ws)) {
                lru_.splice(lru_.begin(), lru_, it->second);
                return it->second->second;
            }
            lru_.erase(it->second);  // the memory of freed weights, now other tensors'
            map_.erase(it);
        }
        for (auto e = lru_.begin(); e != lru_.end(); ++e) {  // the same weights in moved memory
            if (!same_shapes(e->first, k) || !e->second->moved(ws)) continue;
            const std::shared_ptr<Ffn> ffn = e->second;
            {
                std::lock_guard<std::mutex> in_use(ffn->mu);
                ffn->repoint(h, ws);
            }
            map_.erase(e->first);
            e->first = k;
            map_.emplace(k, e);
            lru_.splice(lru_.begin(), lru_, e);
            ++repointed_;
            return ffn;
        }
        for (auto e = lru_.begin(); e != lru_.end();) {  // descriptors of freed weights
            if (e->second->alive()) {
                ++e;
            } else {
                map_.erase(e->first);
                e = lru_.erase(e);
            }
        }
        if (lru_.size() >= kMaxFfns) {  // one in use elsewhere lives on until that use ends
            map_.erase(lru_.back().first);
            lru_.pop_back();
        }
        auto ffn = std::make_shared<Ffn>(h, ws);
        ++made_;
        lru_.emplace_front(k, ffn);
        map_.emplace(k, lru_.begin());
        return ffn;
    }

    std::vector<int64_t> info() {
        std::lock_guard<std::mutex> lock(mu_);
        return {static_cast<int64_t>(lru_.size()), made_, repointed_};
    }

  private:
    // the same weights but for where they are
    static bool same_shapes(const Key& a, const Key& b) {
        return std::memcmp(a.dims, b.dims, sizeof a.dims) == 0 && std::memcmp(a.meta, b.meta, sizeof a.meta) == 0;
    }

    std::mutex mu_;
    std::list<std::pair<Key, std::shared_ptr<Ffn>>> lru_;  // most recently used first
    std::unordered_map<Key, std::list<std::pair<Key, std::shared_ptr<Ffn>>>::iterator, KeyHash> map_;
    int64_t made_ = 0, repointed_ = 0;
};

// never destroyed: descriptors outliving the CUDA runtime at exit would be freed too late
FfnCache& cache() {
    static FfnCache* c = new FfnCache;
    return *c;
}

// a descriptor of `ws`, locked, with the weights' current values
struct UsingFfn {
    std::shared_ptr<Ffn> ffn;
    std::unique_lock<std::mutex> lock;
    UsingFfn(twHandle_t h, const Weights& ws) : ffn(cache().get(h, ws)), lock(ffn->mu) { ffn->sync_weights(h, ws); }
};

Tensor workspace(size_t bytes, const at::TensorOptions& opts) {
    // torch's allocators align to 512 bytes on CUDA and 64 on the CPU (the C API needs 256 / 16)
    return at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, opts.dtype(at::kByte));
}

// ---------------------------------------------------------------------------------------------
// the kernels (CPU and CUDA alike: the handle's backend follows the tensors' device)

std::tuple<Tensor, Tensor, Tensor> ffn_forward(const Tensor& x, const OptTensor& w_gate, const Tensor& w_up,
                                               const Tensor& w_down, bool training, std::optional<bool> save_dense) {
    check_inputs(x, w_gate, w_up, w_down);
    const c10::Device dev = x.device();
    c10::OptionalDeviceGuard guard;
    if (dev.is_cuda()) guard.reset_device(dev);
    const int64_t m = tokens_of(x), d = w_up.size(1);
    const auto opts = x.options();
    const Weights ws = weights_of(w_gate, w_up, w_down);
    twHandle_t h = handle_for(dev);
    UsingFfn use(h, ws);  // made (weights checked) on the first call, even of no tokens
    Ffn& ffn = *use.ffn;
    ffn.set_deterministic(at::globalContext().deterministicAlgorithms());
    Tensor y = at::empty(x.sizes(), opts);
    if (m == 0)
        return {y, at::zeros({}, opts.dtype(at::kFloat)), at::empty({0}, opts.dtype(at::kByte))};
    Tensor l1 = at::empty({}, opts.dtype(at::kFloat));  // written by the forward, in stream order
    const Tensor x2 = as_rows(x, m, d);
    const DnMat xd = rows_of(x2), yd = rows_of(y.view({m, d}));
    if (training) ffn.set_save_dense(save_dense);  // before the sizes: the saved state depends on it
    size_t work_bytes = 0;
    check(twSpGEMMFused_bufferSize(h, ffn.get(), xd.get(), yd.get(), &work_bytes), h, "twSpGEMMFused_bufferSize");
    const Tensor work = workspace(work_bytes, opts);
    ffn.point(TW_FFN_ATTR_L1_OUTPUT, l1.data_ptr());
    Tensor saved;
    if (training) {
        size_t saved_bytes = 0;
        check(twSpGEMMFusedSaved_bufferSize(h, ffn.get(), m, &saved_bytes), h, "twSpGEMMFusedSaved_bufferSize");
        saved = workspace(saved_bytes, opts);
        check(twSpGEMMFusedForwardTrain(h, ffn.get(), xd.get(), yd.get(), saved.data_ptr(), work.data_ptr()), h,
              "twSpGEMMFusedForwardTrain");
    } else {
        saved = at::empty({0}, opts.dtype(at::kByte));
        check(twSpGEMMFused(h, ffn.get(), xd.get(), yd.get(), nullptr, work.data_ptr()), h, "twSpGEMMFused");
    }
    return {y, l1, saved};
}

std::tuple<Tensor, Tensor, Tensor> ffn_backward(const Tensor& x, const OptTensor& w_gate,
                                                        const Tensor& w_up, const Tensor& w_down,
                                                        const Tensor& saved, const Tensor& dy, const Tensor& dl1) {
    check_inputs(x, w_gate, w_up, w_down);
    const int64_t m = tokens_of(x), h_dim = w_up.size(0), d = w_up.size(1);
    TORCH_CHECK(m == 0 || saved.numel() > 0,
                "twblas: the forward ran without gradients enabled: no saved state to differentiate");
    TORCH_CHECK_VALUE(dy.defined() && dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() &&
                          dy.device() == x.device(),
                      "twblas: dy must match x (shape ", x.sizes(), ", ", x.scalar_type(), ", ", x.device(), ")");
    TORCH_CHECK_VALUE(dl1.defined() && dl1.device() == x.device() && dl1.numel() == 1,
                      "twblas: l1's gradient must be one value on ", x.device(), ", got shape ", dl1.sizes(),
                      " on ", dl1.device());
    TORCH_CHECK_VALUE(saved.scalar_type() == at::kByte && saved.device() == x.device(),
                      "twblas: saved must be the forward's uint8 state on ", x.device());
    const c10::Device dev = x.device();
    c10::OptionalDeviceGuard guard;
    if (dev.is_cuda()) guard.reset_device(dev);
    const auto opts = x.options();
    Tensor coeff = dl1.reshape({});
    if (coeff.scalar_type() != at::kFloat) coeff = coeff.to(at::kFloat);
    const Weights ws = weights_of(w_gate, w_up, w_down);
    const bool gated = ws.gated;
    const Tensor x2 = as_rows(x, m, d), dy2 = as_rows(dy, m, d);
    Tensor dx = at::empty(x.sizes(), opts);
    // [dWg; dWu] as one tensor: with stacked weights (gate_up_stacked_layout) a dense-mode step
    // writes both halves by one GEMM
    const Tensor dwgu = at::empty({gated ? 2 * h_dim : h_dim, d}, opts);
    const Tensor dwg = gated ? dwgu.narrow(0, 0, h_dim) : Tensor(), dwu = gated ? dwgu.narrow(0, h_dim, h_dim) : dwgu;
    // w_down's gradient in w_down's in-place layout when it has it (AccumulateGrad keeps it then)
    Tensor dwd = down_in_place(w_down) ? at::empty_strided({d, h_dim}, {1, d}, opts) : at::empty({d, h_dim}, opts);
    const DnMat xd = rows_of(x2), dyd = rows_of(dy2), dxd = rows_of(dx.view({m, d}));
    const DnMat dwgd = gated ? rows_of(dwg) : DnMat(), dwud = rows_of(dwu), dwdd = down_of(dwd);
    twHandle_t h = handle_for(dev);
    UsingFfn use(h, ws);  // the forward's descriptor, also on autograd's own thread
    Ffn& ffn = *use.ffn;
    size_t work_bytes = 0;
    check(twSpGEMMFusedBackward_bufferSize(h, ffn.get(), m, &work_bytes), h, "twSpGEMMFusedBackward_bufferSize");
    const Tensor work = workspace(work_bytes, opts);
    ffn.point(TW_FFN_ATTR_L1_COEFF_POINTER, coeff.data_ptr());  // the l1Coeff argument (0) is then ignored
    check(twSpGEMMFusedBackward(h, ffn.get(), xd.get(), m > 0 ? saved.data_ptr() : nullptr, dyd.get(), 0.0f,
                                dxd.get(), dwgd.get(), dwud.get(), dwdd.get(), work.data_ptr()),
          h, "twSpGEMMFusedBackward");
    return {dx, dwgu, dwd};
}

// ---------------------------------------------------------------------------------------------
// autograd (the Autograd key of ffn_forward)

using ForwardFn = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&, const Tensor&,
                                                     bool, std::optional<bool>);
using BackwardFn = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const OptTensor&, const Tensor&,
                                                              const Tensor&, const Tensor&, const Tensor&,
                                                              const Tensor&);

const c10::TypedOperatorHandle<ForwardFn>& forward_op() {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("twblas::ffn_forward", "").typed<ForwardFn>();
    return op;
}

const c10::TypedOperatorHandle<BackwardFn>& backward_op() {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("twblas::ffn_backward", "").typed<BackwardFn>();
    return op;
}

class FfnFunction : public torch::autograd::Function<FfnFunction> {
  public:
    static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& x,
                                                  const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                                                  bool training, std::optional<bool> save_dense) {
        Tensor y, l1, saved;
        {
            at::AutoDispatchBelowADInplaceOrView below;
            std::tie(y, l1, saved) = forward_op().call(x, w_gate, w_up, w_down, training, save_dense);
        }
        const bool gated = gated_of(w_gate);
        ctx->saved_data["gated"] = gated;
        ctx->save_for_backward({x, gated ? *w_gate : Tensor(), w_up, w_down, saved});
        ctx->mark_non_differentiable({saved});
        // undefined incoming gradients stay undefined: by default autograd would fill a zero
        // gradient for every output without one, and `saved` never has one (a memset of the
        // whole saved state per layer and backward, with its allocation, for nothing)
        ctx->set_materialize_grads(false);
        return {y, l1, saved};
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        const auto s = ctx->get_saved_variables();
        const bool gated = ctx->saved_data["gated"].toBool();
        const Tensor& x = s[0];
        if (!grads[0].defined() && !grads[1].defined())  // neither y nor l1 reached the loss: zero gradients
            return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
        // y or l1 unused by the loss: its gradient is zero (l1's is one fp32 value)
        const Tensor dy = grads[0].defined() ? grads[0] : at::zeros(x.sizes(), x.options());
        const Tensor dl1 = grads[1].defined() ? grads[1] : at::zeros({}, x.options().dtype(at::kFloat));
        auto [dx, dwgu, dwd] = backward_op().call(x, gated ? OptTensor(s[1]) : OptTensor(), s[2], s[3], s[4], dy, dl1);
        if (!gated) return {dx, Tensor(), dwgu, dwd, Tensor(), Tensor()};
        const int64_t h = dwgu.size(0) / 2;
        return {dx, dwgu.narrow(0, 0, h), dwgu.narrow(0, h, h), dwd, Tensor(), Tensor()};
    }
};

bool any_requires_grad(const Tensor& x, const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    return x.requires_grad() || w_up.requires_grad() || w_down.requires_grad() ||
           (gated_of(w_gate) && w_gate->requires_grad());
}

std::tuple<Tensor, Tensor, Tensor> ffn_forward_autograd(const Tensor& x, const OptTensor& w_gate, const Tensor& w_up,
                                                        const Tensor& w_down, bool training, std::optional<bool> save_dense) {
    if (!at::GradMode::is_enabled() || !any_requires_grad(x, w_gate, w_up, w_down)) {
        at::AutoDispatchBelowADInplaceOrView below;  // nothing to record
        return forward_op().call(x, w_gate, w_up, w_down, training, save_dense);
    }
    // recorded for a backward: that needs the saved state, whatever `training` says
    auto out = FfnFunction::apply(x, w_gate, w_up, w_down, true, save_dense);
    return {out[0], out[1], out[2]};
}

// ---------------------------------------------------------------------------------------------
// what the Python layer calls

std::tuple<Tensor, Tensor> sparse_ffn(const Tensor& x, const OptTensor& w_gate, const Tensor& w_up,
                                      const Tensor& w_down, std::optional<bool> save_dense) {
    const bool training = at::GradMode::is_enabled() && x.defined() && w_up.defined() && w_down.defined() &&
                          any_requires_grad(x, w_gate, w_up, w_down);
    auto [y, l1, saved] = forward_op().call(x, w_gate, w_up, w_down, training, save_dense);
    return {y, l1};
}

// the checked weights' CUDA device, where they are on one (for a device guard)
std::optional<c10::Device> cuda_device_of(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    check_weights(w_gate, w_up, w_down);
    return w_up.device().is_cuda() ? std::optional<c10::Device>(w_up.device()) : std::nullopt;
}

// A weight set's descriptor for the queries below (statistics, counts, attributes): on the
// weights' device, this thread's handle, the descriptor locked
struct QueriedFfn {
    c10::OptionalDeviceGuard guard;
    twHandle_t h;
    UsingFfn use;
    QueriedFfn(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down)
        : guard(cuda_device_of(w_gate, w_up, w_down)), h(handle_for(w_up.device())),
          use(h, weights_of(w_gate, w_up, w_down)) {}
    twFfnDescr_t ffn() const { return use.ffn->get(); }
};

std::vector<double> ffn_stats(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    QueriedFfn q(w_gate, w_up, w_down);
    twFfnStats_t s{};
    check(twFfnGetStats(q.h, q.ffn(), &s), q.h, "twFfnGetStats");
    return {static_cast<double>(s.tokens), s.meanRowNnz, static_cast<double>(s.maxRowNnz),
            static_cast<double>(s.overflowRows), s.l1};
}

Tensor ffn_neuron_counts(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down, bool reset) {
    QueriedFfn q(w_gate, w_up, w_down);
    Tensor counts = at::empty({w_up.size(0)}, w_up.options().dtype(at::kLong));
    check(twFfnGetNeuronCounts(q.h, q.ffn(), counts.data_ptr<int64_t>()), q.h, "twFfnGetNeuronCounts");
    if (reset) check(twFfnResetNeuronCounts(q.h, q.ffn()), q.h, "twFfnResetNeuronCounts");
    return counts;
}

// TW_FFN_ATTR_WEIGHT_COPY_BYTES of the weights' descriptor (-1: a library without it)
int64_t ffn_weight_copy_bytes(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    QueriedFfn q(w_gate, w_up, w_down);
    int64_t bytes = -1;
    if (twFfnGetAttribute(q.ffn(), static_cast<twFfnAttribute_t>(kAttrWeightCopyBytes), &bytes,
                          sizeof bytes) != TW_STATUS_SUCCESS)
        bytes = -1;
    return bytes;
}

// TW_FFN_ATTR_DETERMINISTIC of the weights' descriptor: whether its last forward ran under
// torch.use_deterministic_algorithms(True)
bool ffn_deterministic(const OptTensor& w_gate, const Tensor& w_up, const Tensor& w_down) {
    QueriedFfn q(w_gate, w_up, w_down);
    int32_t v = 0;
    check(twFfnGetAttribute(q.ffn(), TW_FFN_ATTR_DETERMINISTIC, &v, sizeof v), nullptr, "twFfnGetAttribute");
    return v != 0;
}

std::vector<int64_t> cache_info() { return cache().info(); }

}  // namespace

TORCH_LIBRARY(twblas, m) {
    // the fake kernels live there (torch imports it when it needs them before anyone else did)
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
    m.set_python_module("twblas._ops");
#else
    m.impl_abstract_pystub("twblas._ops");
#endif
    m.def("sparse_ffn(Tensor x, Tensor? w_gate, Tensor w_up, Tensor w_down, bool? save_dense=None) -> (Tensor y, "
          "Tensor l1)");
    m.def("ffn_forward(Tensor x, Tensor? w_gate, Tensor w_up, Tensor w_down, bool training, bool? save_dense) -> "
          "(Tensor y, Tensor l1, Tensor saved)");
    m.def("ffn_backward(Tensor x, Tensor? w_gate, Tensor w_up, Tensor w_down, Tensor saved, Tensor dy, Tensor dl1) "
          "-> (Tensor dx, Tensor dw_gate_up, Tensor dw_down)");
    m.def("ffn_stats(Tensor? w_gate, Tensor w_up, Tensor w_down) -> float[]");
    m.def("ffn_neuron_counts(Tensor? w_gate, Tensor w_up, Tensor w_down, bool reset=False) -> Tensor");
    m.def("ffn_weight_copy_bytes(Tensor? w_gate, Tensor w_up, Tensor w_down) -> int");
    m.def("ffn_deterministic(Tensor? w_gate, Tensor w_up, Tensor w_down) -> bool");
    m.def("_cache_info() -> int[]", &cache_info);  // no tensor: one kernel for every key
}

TORCH_LIBRARY_IMPL(twblas, CPU, m) {
    m.impl("ffn_forward", ffn_forward);
    m.impl("ffn_backward", ffn_backward);
}

TORCH_LIBRARY_IMPL(twblas, CUDA, m) {
    m.impl("ffn_forward", ffn_forward);
    m.impl("ffn_backward", ffn_backward);
}

TORCH_LIBRARY_IMPL(twblas, Autograd, m) { m.impl("ffn_forward", ffn_forward_autograd); }

// run as they are at every dispatch key: sparse_ffn decomposes into ffn_forward; the statistics,
// the counts and the cache's figures read the library (no autograd, not traced)
TORCH_LIBRARY_IMPL(twblas, CompositeImplicitAutograd, m) {
    m.impl("sparse_ffn", sparse_ffn);
    m.impl("ffn_stats", ffn_stats);
    m.impl("ffn_neuron_counts", ffn_neuron_counts);
    m.impl("ffn_weight_copy_bytes", ffn_weight_copy_bytes);
    m.impl("ffn_deterministic", ffn_deterministic);
}
