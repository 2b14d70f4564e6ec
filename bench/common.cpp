#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace twbench {

Env env;

void configure_ffn(twFfnDescr_t ffn, twHandle_t h) {
    if (env.algorithm != TW_FFN_ALG_DEFAULT)
        ck(twFfnSetAttribute(ffn, TW_FFN_ATTR_ALGORITHM, &env.algorithm, sizeof env.algorithm), h, "--algorithm");
    for (const auto &[name, value] : env.tuning) ck(twFfnSetTuning(ffn, name.c_str(), value), h, "--tuning");
}

namespace {
std::shared_ptr<Problem> current;
std::string current_key;

float bf16_to_float(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
}  // namespace

void ck(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

Problem::~Problem() {
    for (twFfnDescr_t f : ffn) twDestroyFfn(f);
    twDestroy(handle);
}

std::shared_ptr<Problem> problem(Shape s, const std::string &profile, int64_t max_m) {
    const std::string key =
        std::to_string(s.d) + "/" + std::to_string(s.h) + "/" + profile + "/" + std::to_string(max_m);
    if (current_key == key) return current;
    current.reset();  // free the previous problem's memory first
    current_key.clear();
    auto p = std::make_shared<Problem>();
    p->shape = s;
    p->profile = profile;
    p->max_m = max_m;
    tt::ProblemSpec spec;
    spec.tokens = max_m;
    spec.model_dim = s.d;
    spec.hidden_dim = s.h;
    spec.seed = 2026;
    // "PROFILE+hot-N": N units (spread over H) fire on about every token, their gate rows negated
    // (a trained model's busiest units: the PyTorch example's runs had a few a layer)
    const size_t plus = profile.find("+hot-");
    const int64_t hot = plus == std::string::npos ? 0 : std::stoll(profile.substr(plus + 5));
    if (!tt::parse_profile(profile.substr(0, plus), &spec.profile, &spec.active_units) || hot < 0 || hot > s.h)
        throw std::runtime_error("bad profile " + profile);
    p->host = tt::make_ffn_problem(spec);
    tt::make_units_hot(p->host.w_gate, s.h, s.d, hot);
    const auto x16 = tt::to_bf16(p->host.x);
    std::vector<uint16_t> gu16 = tt::to_bf16(p->host.w_gate);
    const auto u16 = tt::to_bf16(p->host.w_up);
    gu16.insert(gu16.end(), u16.begin(), u16.end());
    const auto wd_rows16 = tt::to_bf16(p->host.w_down);
    std::vector<uint16_t> wd_lin16(wd_rows16.size());
    for (int64_t j = 0; j < s.h; ++j)
        for (int64_t c = 0; c < s.d; ++c) wd_lin16[c * s.h + j] = wd_rows16[j * s.d + c];
    ck(twCreateWithBackend(&p->handle, TW_BACKEND_CUDA), nullptr, "twCreateWithBackend(CUDA)");
    ck(twSetStream(p->handle, env.stream), p->handle, "twSetStream");
    for (int i = 0; i < kInstances; ++i) {
        p->x.push_back(std::make_unique<DeviceMemory>(x16));
        p->wgu.push_back(std::make_unique<DeviceMemory>(gu16));
        p->wd_lin.push_back(std::make_unique<DeviceMemory>(wd_lin16));
        p->wd_ffn.push_back(std::make_unique<DeviceMemory>(wd_rows16));
        twDnMatDescr_t wg, wu, wd;
        ck(twCreateDnMat(&wg, s.h, s.d, s.d, p->wgu[i]->get<uint16_t>(), TW_R_16BF, TW_ORDER_ROW), nullptr, "Wg");
        ck(twCreateDnMat(&wu, s.h, s.d, s.d, p->wgu[i]->get<uint16_t>() + s.h * s.d, TW_R_16BF, TW_ORDER_ROW), nullptr,
           "Wu");
        // Wd as rows (what twblas.torch keeps as down_proj.weight's storage): no copy in the FFN
        ck(twCreateDnMat(&wd, s.h, s.d, s.d, p->wd_ffn[i]->get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "Wd");
        twFfnDescr_t f = nullptr;
        ck(twCreateFfn(p->handle, &f, TW_FFN_GATED_RELU, wg, wu, wd), p->handle, "twCreateFfn");
        configure_ffn(f, p->handle);
        p->ffn.push_back(f);
        for (twDnMatDescr_t d : {wg, wu, wd}) twDestroyDnMat(d);
    }
    p->wd_rows = std::make_unique<DeviceMemory>(wd_rows16);
    current = p;
    current_key = key;
    return p;
}

tt::DenseFusedWeights Problem::fused_weights(int inst) {
    if (wgu_interleaved.empty()) {
        for (int i = 0; i < kInstances; ++i) {
            wgu_interleaved.push_back(std::make_unique<DeviceMemory>(wgu[i]->bytes()));
            tt::interleave_gate_up(env.stream, wgu[i]->get(), shape.h, shape.d, wgu_interleaved.back()->get());
        }
        ck(cudaStreamSynchronize(env.stream), "interleave_gate_up");
    }
    return {wgu_interleaved[inst]->get(), wd_lin[inst]->get()};
}

void release_problems() {
    current.reset();
    current_key.clear();
}

std::vector<uint16_t> download(const void *device, size_t count) {
    std::vector<uint16_t> v(count);
    ck(cudaMemcpyAsync(v.data(), device, count * 2, cudaMemcpyDeviceToHost, env.stream), "download");
    ck(cudaStreamSynchronize(env.stream), "download");
    return v;
}

const std::vector<uint16_t> &dense_reference(Problem &p, int64_t m) {
    auto it = p.dense_y.find(m);
    if (it != p.dense_y.end()) return it->second;
    tt::DenseFfn dense({p.shape.d, p.shape.h, m});
    DeviceMemory y(static_cast<size_t>(m * p.shape.d) * 2);
    dense.forward(env.stream, p.x[0]->get(), p.weights(0), m, y.get());
    return p.dense_y[m] = download(y.get(), static_cast<size_t>(m * p.shape.d));
}

double rel_error(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void add_problem_counters(benchmark::State &state, const Problem &p, int64_t m) {
    state.counters["tokens"] = static_cast<double>(m);
    state.counters["d"] = static_cast<double>(p.shape.d);
    state.counters["h"] = static_cast<double>(p.shape.h);
    state.SetLabel(p.profile);
}

void time_graphs(benchmark::State &state, int batch, std::vector<cudaGraphExec_t> &execs) {
    const int n = static_cast<int>(execs.size());
    time_loop(state, batch, [&](int run) { ck(cudaGraphLaunch(execs[run % n], env.stream), "launch"); });
    for (auto e : execs) cudaGraphExecDestroy(e);
    execs.clear();
}

std::string bench_name(const char *variant, Shape s, const std::string &profile, int64_t m) {
    return std::string("ffn/") + variant + "/d" + std::to_string(s.d) + "_h" + std::to_string(s.h) + "/" + profile +
           "/m" + std::to_string(m);
}

namespace {
int repetitions_now = 5;
}  // namespace

void set_repetitions(int repetitions) { repetitions_now = repetitions; }

void add(const std::string &name, BenchFn fn, Shape s, const std::string &profile, int64_t max_m, int64_t m,
         int calls_per_iteration) {
    auto *b = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State &st) { fn(st, s, profile, max_m, m); });
    b->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Repetitions(repetitions_now)
        ->ReportAggregatesOnly(true)
        ->MinTime(kMinTimedSeconds / std::max(1, calls_per_iteration));
}

}  // namespace twbench
