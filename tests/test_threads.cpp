// Threads on the CPU backend: N threads, each with its own handle, sharing one FFN descriptor
// (forwards, training steps, and the statistics / neuron-count calls concurrently with them),
// and N threads with N FFNs. Built under ThreadSanitizer by scripts/tsan.sh.
//
// What sharing one FFN guarantees on the CPU backend (src/host/reference/ffn.cpp): each forward
// adds its neuron counts to the FFN's in one step under the FFN's lock, so the counts after
// concurrent forwards are exactly the sum of theirs, and a reader never sees part of a forward;
// the statistics are those of one whole forward, the last one to publish. Catch2's assertions
// are not thread-safe: the threads only record what they saw, the checks run after the join.
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "test_support.hpp"
#include "testing/problem.hpp"

using namespace twtest;

namespace {

constexpr int kThreads = 4;
constexpr int kRepeats = 3;

/// Releases every waiting thread at once, so that their calls overlap.
class StartGate {
  public:
    void wait() {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return open_; });
    }
    void open() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            open_ = true;
        }
        cv_.notify_all();
    }

  private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool open_ = false;
};

bool same_stats(const twFfnStats_t &a, const twFfnStats_t &b) {
    return a.tokens == b.tokens && a.meanRowNnz == b.meanRowNnz && a.maxRowNnz == b.maxRowNnz &&
           a.overflowRows == b.overflowRows && a.l1 == b.l1;
}

std::string show(const twFfnStats_t &s) {
    std::ostringstream os;
    os << "{tokens " << s.tokens << ", mean " << s.meanRowNnz << ", max " << s.maxRowNnz << ", overflow "
       << s.overflowRows << ", l1 " << s.l1 << "}";
    return os.str();
}

std::vector<uint32_t> all_bits(const Dense &m) {
    std::vector<uint32_t> out;
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) out.push_back(m.bits(r, c));
    return out;
}

/// Weights of one FFN and the inputs of every thread (X_i: rows [i M, (i + 1) M) of one
/// generated problem, so each thread gets different tokens on the same weights).
struct Problem {
    int64_t m, d, h;
    bool gated;
    twDataType_t type;
    twblas::testing::FfnProblem p;
    std::unique_ptr<Dense> wg, wu, wd;
    std::vector<std::unique_ptr<Dense>> x, y, dy;

    Problem(int64_t m_, int64_t d_, int64_t h_, bool gated_, twDataType_t type_, uint64_t seed,
            twblas::testing::Profile profile = twblas::testing::Profile::Heavy)
        : m(m_), d(d_), h(h_), gated(gated_), type(type_) {
        twblas::testing::ProblemSpec spec;
        spec.tokens = kThreads * m;
        spec.model_dim = d;
        spec.hidden_dim = h;
        spec.profile = profile;
        spec.active_units = 29;
        spec.gated = gated;
        spec.seed = seed;
        spec.heavy_fraction = 0.05;  // a few dense rows: the overflow statistics are not all 0
        p = twblas::testing::make_ffn_problem(spec);
        wu = std::make_unique<Dense>(h, d, type);
        wu->fill(p.w_up);
        wd = std::make_unique<Dense>(h, d, type, TW_ORDER_COL);
        wd->fill(p.w_down);
        if (gated) {
            wg = std::make_unique<Dense>(h, d, type);
            wg->fill(p.w_gate);
        }
        const std::vector<float> grads = random_normal(static_cast<size_t>(kThreads * m * d), seed + 7);
        for (int i = 0; i < kThreads; ++i) {
            x.push_back(std::make_unique<Dense>(m, d, type));
            x.back()->fill(std::vector<float>(p.x.begin() + i * m * d, p.x.begin() + (i + 1) * m * d));
            dy.push_back(std::make_unique<Dense>(m, d, type));
            dy.back()->fill(std::vector<float>(grads.begin() + i * m * d, grads.begin() + (i + 1) * m * d));
            y.push_back(std::make_unique<Dense>(m, d, type));
            y.back()->poison();
        }
    }
    twFfnKind_t kind() const { return gated ? TW_FFN_GATED_RELU : TW_FFN_RELU; }
    twDnMatDescr_t gate() const { return wg ? wg->d : nullptr; }
};

twFfnDescr_t make_ffn(twHandle_t h, const Problem &p) {
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, p.kind(), p.gate(), *p.wu, *p.wd));
    return ffn;
}

/// What one forward thread saw: the first failing status (SUCCESS if none) and its message.
struct Outcome {
    twStatus_t status = TW_STATUS_SUCCESS;
    std::string message;
    void record(twHandle_t h, twStatus_t s, const char *what) {
        if (s == TW_STATUS_SUCCESS || status != TW_STATUS_SUCCESS) return;
        status = s;
        message = std::string(what) + ": " + twGetStatusName(s) + ": " + twGetErrorMessage(h);
    }
};

void require_ok(const std::vector<Outcome> &outcomes) {
    for (size_t i = 0; i < outcomes.size(); ++i) {
        INFO("thread " << i << ": " << outcomes[i].message);
        REQUIRE(outcomes[i].status == TW_STATUS_SUCCESS);
    }
}

/// The forward of X_i alone on a fresh FFN: Y bits, neuron counts, statistics.
struct Single {
    std::vector<uint32_t> y;
    std::vector<int64_t> counts;
    twFfnStats_t stats{};
};

Single single_forward(const Problem &p, int i) {
    Handle h;
    twFfnDescr_t ffn = make_ffn(h, p);
    Dense y(p.m, p.d, p.type);
    y.poison();
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, *p.x[static_cast<size_t>(i)], y, nullptr, nullptr));
    Single s;
    s.y = all_bits(y);
    s.counts.resize(static_cast<size_t>(p.h));
    TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, s.counts.data()));
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &s.stats));
    REQUIRE(twDestroyFfn(ffn) == TW_STATUS_SUCCESS);
    return s;
}

}  // namespace

TEST_CASE("threads: N handles share one FFN; counts add up, Y exact, statistics of one forward", "[threads]") {
    struct Config {
        bool gated;
        twDataType_t type;
    };
    for (const Config cfg : {Config{true, TW_R_16BF}, Config{false, TW_R_32F}}) {
        INFO((cfg.gated ? "gated" : "plain") << " type " << cfg.type);
        const Problem p(48, 64, 512, cfg.gated, cfg.type, 21);
        std::vector<Single> single;
        for (int i = 0; i < kThreads; ++i) single.push_back(single_forward(p, i));

        Handle owner;
        twFfnDescr_t ffn = make_ffn(owner, p);
        std::vector<std::unique_ptr<Handle>> handles;
        for (int i = 0; i < kThreads; ++i) handles.push_back(std::make_unique<Handle>());
        std::vector<Outcome> outcomes(kThreads);
        std::vector<std::vector<uint32_t>> y_seen(kThreads);  // Y after each repeat, all repeats
        StartGate gate;
        std::vector<std::thread> threads;
        for (int i = 0; i < kThreads; ++i)
            threads.emplace_back([&, i] {
                const twHandle_t h = *handles[static_cast<size_t>(i)];
                Dense &y = *p.y[static_cast<size_t>(i)];
                gate.wait();
                for (int r = 0; r < kRepeats; ++r) {
                    outcomes[static_cast<size_t>(i)].record(
                        h, twSpGEMMFused(h, ffn, *p.x[static_cast<size_t>(i)], y, nullptr, nullptr), "twSpGEMMFused");
                    const std::vector<uint32_t> bits = all_bits(y);
                    y_seen[static_cast<size_t>(i)].insert(y_seen[static_cast<size_t>(i)].end(), bits.begin(), bits.end());
                    y.poison();
                }
            });
        gate.open();
        for (std::thread &t : threads) t.join();
        require_ok(outcomes);

        for (int i = 0; i < kThreads; ++i) {
            INFO("thread " << i);
            std::vector<uint32_t> want;
            for (int r = 0; r < kRepeats; ++r) want.insert(want.end(), single[i].y.begin(), single[i].y.end());
            REQUIRE(y_seen[static_cast<size_t>(i)] == want);
        }
        std::vector<int64_t> counts(static_cast<size_t>(p.h)), want(static_cast<size_t>(p.h), 0);
        TW_REQUIRE_OK(owner, twFfnGetNeuronCounts(owner, ffn, counts.data()));
        for (int i = 0; i < kThreads; ++i)
            for (int64_t j = 0; j < p.h; ++j) want[static_cast<size_t>(j)] += kRepeats * single[i].counts[static_cast<size_t>(j)];
        REQUIRE(counts == want);
        int64_t total = 0;
        for (int64_t c : counts) total += c;
        REQUIRE(total > 0);

        twFfnStats_t stats{};
        TW_REQUIRE_OK(owner, twFfnGetStats(owner, ffn, &stats));
        bool one_of = false;
        for (const Single &s : single) one_of |= same_stats(stats, s.stats);
        INFO("stats " << show(stats));
        REQUIRE(one_of);
        REQUIRE(twDestroyFfn(ffn) == TW_STATUS_SUCCESS);
    }
}

TEST_CASE("threads: N handles with N FFNs, each created, run and destroyed in its own thread", "[threads]") {
    // different weights per thread (a problem per seed), each against its single-threaded run
    std::vector<std::unique_ptr<Problem>> problems;
    std::vector<Single> single;
    for (int i = 0; i < kThreads; ++i) {
        problems.push_back(std::make_unique<Problem>(32, 64, 384, i % 2 == 0, TW_R_16BF, 100 + i));
        single.push_back(single_forward(*problems.back(), 0));
    }
    std::vector<std::unique_ptr<Handle>> handles;
    for (int i = 0; i < kThreads; ++i) handles.push_back(std::make_unique<Handle>());
    std::vector<Outcome> outcomes(kThreads);
    std::vector<Single> seen(kThreads);
    StartGate gate;
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            const twHandle_t h = *handles[static_cast<size_t>(i)];
            const Problem &p = *problems[static_cast<size_t>(i)];
            Outcome &o = outcomes[static_cast<size_t>(i)];
            Single &s = seen[static_cast<size_t>(i)];
            Dense &y = *p.y[0];
            gate.wait();
            for (int r = 0; r < kRepeats; ++r) {
                twFfnDescr_t ffn = nullptr;
                o.record(h, twCreateFfn(h, &ffn, p.kind(), p.gate(), *p.wu, *p.wd), "twCreateFfn");
                if (!ffn) return;
                o.record(h, twSpGEMMFused(h, ffn, *p.x[0], y, nullptr, nullptr), "twSpGEMMFused");
                s.counts.assign(static_cast<size_t>(p.h), -1);
                o.record(h, twFfnGetNeuronCounts(h, ffn, s.counts.data()), "twFfnGetNeuronCounts");
                o.record(h, twFfnGetStats(h, ffn, &s.stats), "twFfnGetStats");
                o.record(h, twDestroyFfn(ffn), "twDestroyFfn");
                s.y = all_bits(y);
                y.poison();
            }
        });
    gate.open();
    for (std::thread &t : threads) t.join();
    require_ok(outcomes);
    for (int i = 0; i < kThreads; ++i) {
        INFO("thread " << i << " stats " << show(seen[i].stats) << " want " << show(single[i].stats));
        REQUIRE(seen[i].y == single[i].y);
        REQUIRE(seen[i].counts == single[i].counts);
        REQUIRE(same_stats(seen[i].stats, single[i].stats));
    }
}

TEST_CASE("threads: statistics, neuron counts and resets concurrently with forwards on one FFN", "[threads]") {
    // Every forward runs the same X: its counts c and statistics s are known, so whatever a
    // reader sees between whole forwards is k * c for one integer k, and s (or the zeros before
    // the first forward). A torn read would break that.
    const Problem p(40, 64, 512, true, TW_R_16BF, 33);
    const Single one = single_forward(p, 0);
    size_t ref = 0;  // a unit with a non-zero count, to find k
    while (ref < one.counts.size() && one.counts[ref] == 0) ++ref;
    REQUIRE(ref < one.counts.size());

    for (const bool with_resets : {false, true}) {
        INFO((with_resets ? "with" : "without") << " resets");
        Handle owner;
        twFfnDescr_t ffn = make_ffn(owner, p);
        constexpr int kForwardThreads = kThreads - 1;
        std::vector<std::unique_ptr<Handle>> handles;
        for (int i = 0; i < kThreads; ++i) handles.push_back(std::make_unique<Handle>());
        std::vector<std::unique_ptr<Dense>> ys;
        for (int i = 0; i < kForwardThreads; ++i) ys.push_back(std::make_unique<Dense>(p.m, p.d, p.type));
        std::vector<Outcome> outcomes(kThreads);
        std::atomic<int> running{kForwardThreads};
        int64_t reads = 0, torn_counts = 0, torn_stats = 0, resets = 0, max_k = 0;
        StartGate gate;
        std::vector<std::thread> threads;
        for (int i = 0; i < kForwardThreads; ++i)
            threads.emplace_back([&, i] {
                const twHandle_t h = *handles[static_cast<size_t>(i)];
                gate.wait();
                for (int r = 0; r < 2 * kRepeats; ++r)
                    outcomes[static_cast<size_t>(i)].record(
                        h, twSpGEMMFused(h, ffn, *p.x[0], *ys[static_cast<size_t>(i)], nullptr, nullptr), "twSpGEMMFused");
                --running;
            });
        threads.emplace_back([&] {  // the reader (and resetter)
            const twHandle_t h = *handles[kThreads - 1];
            Outcome &o = outcomes[kThreads - 1];
            std::vector<int64_t> counts(static_cast<size_t>(p.h));
            const twFfnStats_t zero{0, 0.0, 0, 0, 0.0};
            gate.wait();
            for (bool last = false; !last && reads < 100000;) {
                last = running.load() == 0;  // one more round after the forwards are done
                twFfnStats_t s{};
                o.record(h, twFfnGetStats(h, ffn, &s), "twFfnGetStats");
                torn_stats += !(same_stats(s, one.stats) || same_stats(s, zero));
                o.record(h, twFfnGetNeuronCounts(h, ffn, counts.data()), "twFfnGetNeuronCounts");
                const int64_t k = counts[ref] / one.counts[ref];
                bool whole = counts[ref] % one.counts[ref] == 0;
                for (size_t j = 0; j < counts.size(); ++j) whole &= counts[j] == k * one.counts[j];
                torn_counts += !whole;
                max_k = std::max(max_k, k);
                if (with_resets && reads % 3 == 1) {
                    o.record(h, twFfnResetNeuronCounts(h, ffn), "twFfnResetNeuronCounts");
                    ++resets;
                }
                ++reads;
                std::this_thread::yield();
            }
        });
        gate.open();
        for (std::thread &t : threads) t.join();
        require_ok(outcomes);
        INFO(reads << " reads, " << resets << " resets, largest k " << max_k);
        REQUIRE(reads > 0);
        REQUIRE(torn_stats == 0);
        REQUIRE(torn_counts == 0);
        REQUIRE(max_k <= kForwardThreads * 2 * kRepeats);
        for (const auto &y : ys) REQUIRE(all_bits(*y) == one.y);

        // after the join: every forward counted once (no resets), or a whole number of them
        std::vector<int64_t> counts(static_cast<size_t>(p.h));
        TW_REQUIRE_OK(owner, twFfnGetNeuronCounts(owner, ffn, counts.data()));
        const int64_t k = counts[ref] / one.counts[ref];
        if (!with_resets) REQUIRE(k == kForwardThreads * 2 * kRepeats);
        for (size_t j = 0; j < counts.size(); ++j) REQUIRE(counts[j] == k * one.counts[j]);
        twFfnStats_t stats{};
        TW_REQUIRE_OK(owner, twFfnGetStats(owner, ffn, &stats));
        REQUIRE(same_stats(stats, one.stats));
        REQUIRE(twDestroyFfn(ffn) == TW_STATUS_SUCCESS);
    }
}

TEST_CASE("threads: training steps (forward with saved state + backward) on one shared FFN", "[threads]") {
    const Problem p(32, 48, 256, true, TW_R_16BF, 55);
    const float l1 = 0.25f;
    struct Step {
        std::vector<uint32_t> y, dx, dwg, dwu, dwd;
        bool operator==(const Step &o) const { return y == o.y && dx == o.dx && dwg == o.dwg && dwu == o.dwu && dwd == o.dwd; }
    };
    // per thread: its own saved state, workspaces and outputs
    struct Slot {
        std::vector<uint8_t> saved;
        std::unique_ptr<Dense> dx, dwg, dwu, dwd;
    };
    Handle owner;
    twFfnDescr_t ffn = make_ffn(owner, p);
    size_t saved_bytes = 0, fw = 0, bw = 0;
    TW_REQUIRE_OK(owner, twSpGEMMFusedSaved_bufferSize(owner, ffn, p.m, &saved_bytes));
    TW_REQUIRE_OK(owner, twSpGEMMFused_bufferSize(owner, ffn, *p.x[0], *p.y[0], &fw));
    TW_REQUIRE_OK(owner, twSpGEMMFusedBackward_bufferSize(owner, ffn, p.m, &bw));
    REQUIRE(fw == 0);
    REQUIRE(bw == 0);  // the CPU backend needs no workspace
    std::vector<Slot> slots(kThreads);
    for (Slot &s : slots) {
        s.saved.assign(saved_bytes, 0);
        s.dx = std::make_unique<Dense>(p.m, p.d, p.type);
        s.dwg = std::make_unique<Dense>(p.h, p.d, p.type);
        s.dwu = std::make_unique<Dense>(p.h, p.d, p.type);
        s.dwd = std::make_unique<Dense>(p.h, p.d, p.type, TW_ORDER_COL);
    }
    auto step = [&](twHandle_t h, int i, Outcome &o) {
        Slot &s = slots[static_cast<size_t>(i)];
        Dense &y = *p.y[static_cast<size_t>(i)];
        for (Dense *m : {&y, s.dx.get(), s.dwg.get(), s.dwu.get(), s.dwd.get()}) m->poison();
        o.record(h, twSpGEMMFusedForwardTrain(h, ffn, *p.x[static_cast<size_t>(i)], y, s.saved.data(), nullptr),
                 "twSpGEMMFusedForwardTrain");
        o.record(h, twSpGEMMFusedBackward(h, ffn, *p.x[static_cast<size_t>(i)], s.saved.data(), *p.dy[static_cast<size_t>(i)], l1,
                                          *s.dx, *s.dwg, *s.dwu, *s.dwd, nullptr),
                 "twSpGEMMFusedBackward");
        return Step{all_bits(y), all_bits(*s.dx), all_bits(*s.dwg), all_bits(*s.dwu), all_bits(*s.dwd)};
    };

    // one thread at a time first: the expected outputs, counts and statistics of each step
    std::vector<Step> want;
    std::vector<int64_t> want_counts(static_cast<size_t>(p.h), 0);
    std::vector<twFfnStats_t> want_stats;
    for (int i = 0; i < kThreads; ++i) {
        Outcome o;
        TW_REQUIRE_OK(owner, twFfnResetNeuronCounts(owner, ffn));
        want.push_back(step(owner, i, o));
        INFO(o.message);
        REQUIRE(o.status == TW_STATUS_SUCCESS);
        std::vector<int64_t> c(static_cast<size_t>(p.h));
        TW_REQUIRE_OK(owner, twFfnGetNeuronCounts(owner, ffn, c.data()));
        for (size_t j = 0; j < c.size(); ++j) want_counts[j] += kRepeats * c[j];
        want_stats.emplace_back();
        TW_REQUIRE_OK(owner, twFfnGetStats(owner, ffn, &want_stats.back()));
    }
    TW_REQUIRE_OK(owner, twFfnResetNeuronCounts(owner, ffn));

    std::vector<std::unique_ptr<Handle>> handles;
    for (int i = 0; i < kThreads; ++i) handles.push_back(std::make_unique<Handle>());
    std::vector<Outcome> outcomes(kThreads);
    std::vector<std::vector<Step>> seen(kThreads);
    StartGate gate;
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            gate.wait();
            for (int r = 0; r < kRepeats; ++r)
                seen[static_cast<size_t>(i)].push_back(step(*handles[static_cast<size_t>(i)], i, outcomes[static_cast<size_t>(i)]));
        });
    gate.open();
    for (std::thread &t : threads) t.join();
    require_ok(outcomes);
    for (int i = 0; i < kThreads; ++i)
        for (int r = 0; r < kRepeats; ++r) {
            INFO("thread " << i << " repeat " << r);
            REQUIRE(seen[i][r] == want[i]);
        }
    std::vector<int64_t> counts(static_cast<size_t>(p.h));
    TW_REQUIRE_OK(owner, twFfnGetNeuronCounts(owner, ffn, counts.data()));
    REQUIRE(counts == want_counts);
    twFfnStats_t stats{};
    TW_REQUIRE_OK(owner, twFfnGetStats(owner, ffn, &stats));
    bool one_of = false;
    for (const twFfnStats_t &s : want_stats) one_of |= same_stats(stats, s);
    INFO("stats " << show(stats));
    REQUIRE(one_of);
    REQUIRE(twDestroyFfn(ffn) == TW_STATUS_SUCCESS);
}
