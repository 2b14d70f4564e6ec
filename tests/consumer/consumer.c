/* An outside C99 program built against the INSTALLED twblas package, once through CMake
 * (find_package(twblas), twblas::twblas) and once through pkg-config (tests/consumer).
 * Public API only.
 *
 * A gated ReLU FFN in bf16 with odd shapes: M = 7 tokens, D = 24, H = 300 (not a multiple of
 * the 256-column TwELL tile). Token HEAVY has almost every unit active (its TwELL row
 * overflows), the others about 7 %; every 37th unit is dead (never active). Wd is given once
 * in TW_ORDER_ROW and once in TW_ORDER_COL (nn.Linear's down_proj.weight memory): both must
 * match a naive double computation within a bf16 bound, and each other. A few bad inputs must
 * give a status, not a crash. Returns 0 only when every check passes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <twblas/twblas.h>

enum { M = 7, D = 24, H = 300, HEAVY = 3 };

static int failures = 0;

static void fail(const char *what) {
    ++failures;
    fprintf(stderr, "FAIL: %s\n", what);
}

/* Checks a status; prints the library's message when it is not the expected one. */
static int expect(twStatus_t got, twStatus_t want, twHandle_t h, const char *what) {
    if (got == want) return 1;
    ++failures;
    fprintf(stderr, "FAIL: %s: expected %s, got %s (%s)\n", what, twGetStatusName(want),
            twGetStatusName(got), twGetErrorMessage(h));
    return 0;
}
#define OK(call, h) expect((call), TW_STATUS_SUCCESS, (h), #call)

/* bf16 <-> float (round to nearest even; every input below is exact in bf16). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t seed = 12345u;
static int next_int(int n) { /* 0 .. n-1 */
    seed = seed * 1664525u + 1013904223u;
    return (int)((seed >> 8) % (uint32_t)n);
}
static int dead(int j) { return j % 37 == 5; }

/* Inputs as doubles (the reference) and as bf16 patterns (the library). */
static double x[M][D], wg[H][D], wu[H][D], wd[H][D];
static uint16_t xb[M * D], wgb[H * D], wub[H * D], wd_row[H * D], wd_col[D * H];
/* Reference: gate pre-activation, hidden h, output Y, and sum_j |h_tj * Wd_jc| per output. */
static double g_ref[M][H], h_ref[M][H], y_ref[M][D], y_mag[M][D];

static void make_problem(void) {
    int t, j, k, c;
    for (t = 0; t < M; ++t) {
        x[t][0] = 1.0;                      /* a bias feature */
        x[t][1] = t == HEAVY ? 4.0 : 0.0;  /* switches on almost every unit of HEAVY */
        for (k = 2; k < D; ++k) x[t][k] = (next_int(5) - 2) * 0.5;
    }
    for (j = 0; j < H; ++j) {
        wg[j][0] = -0.5;
        wg[j][1] = dead(j) ? 0.0 : 0.5;
        for (k = 2; k < D; ++k) wg[j][k] = dead(j) ? 0.0 : (next_int(3) - 1) * 0.125;
        for (k = 0; k < D; ++k) wu[j][k] = (next_int(17) - 8) / 8.0;
        for (k = 0; k < D; ++k) wd[j][k] = (next_int(17) - 8) / 16.0;
    }
    for (t = 0; t < M; ++t)
        for (k = 0; k < D; ++k) xb[t * D + k] = to_bf16((float)x[t][k]);
    for (j = 0; j < H; ++j)
        for (k = 0; k < D; ++k) {
            wgb[j * D + k] = to_bf16((float)wg[j][k]);
            wub[j * D + k] = to_bf16((float)wu[j][k]);
            wd_row[j * D + k] = to_bf16((float)wd[j][k]); /* (j, k) at j * D + k */
            wd_col[k * H + j] = to_bf16((float)wd[j][k]); /* (j, k) at k * H + j: [D, H] */
        }
    for (t = 0; t < M; ++t) {
        for (j = 0; j < H; ++j) {
            double g = 0, u = 0;
            for (k = 0; k < D; ++k) {
                g += x[t][k] * wg[j][k];
                u += x[t][k] * wu[j][k];
            }
            g_ref[t][j] = g;
            h_ref[t][j] = g > 0 ? g * u : 0.0;
        }
        for (c = 0; c < D; ++c) {
            double y = 0, mag = 0;
            for (j = 0; j < H; ++j) {
                y += h_ref[t][j] * wd[j][c];
                mag += fabs(h_ref[t][j] * wd[j][c]);
            }
            y_ref[t][c] = y;
            y_mag[t][c] = mag;
        }
    }
}

/* |Y - Yref| <= 4u (sum_j |h_j Wd_jc| + |Yref|), u = 2^-8 the bf16 unit roundoff: u and h are
 * rounded to bf16 once each (<= 2u + u^2 a term), Y once more (u), accumulation is fp32. */
static double check_output(const uint16_t *y, const char *what) {
    double worst = 0;
    int t, c, bad = 0;
    for (t = 0; t < M; ++t)
        for (c = 0; c < D; ++c) {
            const double got = from_bf16(y[t * D + c]);
            const double err = fabs(got - y_ref[t][c]);
            const double tol = 4.0 / 256.0 * (y_mag[t][c] + fabs(y_ref[t][c])) + 1e-6;
            if (err / tol > worst) worst = err / tol;
            if (!(err <= tol) && bad++ < 5)
                fprintf(stderr, "  %s: Y[%d][%d] = %g, expected %g (tolerance %g)\n", what, t, c, got,
                        y_ref[t][c], tol);
        }
    if (bad) fail(what);
    return worst;
}

int main(void) {
    twHandle_t h = NULL;
    twDnMatDescr_t X = NULL, Xbad = NULL, Wg = NULL, Wu = NULL, WdRow = NULL, WdCol = NULL;
    twDnMatDescr_t Y1 = NULL, Y2 = NULL, Hd = NULL;
    twSpMatDescr_t hidden = NULL, hidden_hy = NULL;
    twFfnDescr_t ffn_row = NULL, ffn_col = NULL, ffn_bad = NULL;
    uint16_t y1[M * D], y2[M * D], hdense[M * H], poison[M * D];
    void *ws = NULL, *tw_buf = NULL, *hy_buf = NULL;
    size_t ws_bytes = 0, n = 0, tw_bytes = 0, hy_bytes = 0;
    int version = 0, t, j, i;
    double worst_row = 0, worst_col = 0;

    make_problem();
    for (i = 0; i < M * D; ++i) poison[i] = y1[i] = y2[i] = 0x7fc1; /* a NaN pattern */

    OK(twGetVersion(&version), NULL);
    if (version != TWBLAS_VERSION) fail("twGetVersion differs from the installed header's TWBLAS_VERSION");
    if (!OK(twCreateWithBackend(&h, TW_BACKEND_CPU), NULL)) return 1; /* host memory below */

    OK(twCreateDnMat(&X, M, D, D, xb, TW_R_16BF, TW_ORDER_ROW), NULL);
    OK(twCreateDnMat(&Wg, H, D, D, wgb, TW_R_16BF, TW_ORDER_ROW), NULL);
    OK(twCreateDnMat(&Wu, H, D, D, wub, TW_R_16BF, TW_ORDER_ROW), NULL);
    OK(twCreateDnMat(&WdRow, H, D, D, wd_row, TW_R_16BF, TW_ORDER_ROW), NULL);
    OK(twCreateDnMat(&WdCol, H, D, H, wd_col, TW_R_16BF, TW_ORDER_COL), NULL); /* logical H x D */
    OK(twCreateDnMat(&Y1, M, D, D, y1, TW_R_16BF, TW_ORDER_ROW), NULL);
    OK(twCreateDnMat(&Y2, M, D, D, y2, TW_R_16BF, TW_ORDER_ROW), NULL);
    OK(twCreateDnMat(&Hd, M, H, H, hdense, TW_R_16BF, TW_ORDER_ROW), NULL);
    if (failures) return 1;

    OK(twCreateFfn(h, &ffn_row, TW_FFN_GATED_RELU, Wg, Wu, WdRow), h);
    OK(twCreateFfn(h, &ffn_col, TW_FFN_GATED_RELU, Wg, Wu, WdCol), h);
    if (failures) return 1;

    /* hidden: a TwELL (the heavy row overflows it: recorded, Y stays exact) and a hybrid. */
    OK(twTwellBufferSize(M, H, 256, 8, &tw_bytes), NULL);
    OK(twHybridBufferSize(M, H, 32, M, TW_R_16BF, &hy_bytes), NULL);
    tw_buf = malloc(tw_bytes);
    hy_buf = malloc(hy_bytes); /* malloc's alignment (16 bytes and more) is enough */
    OK(twCreateTwell(&hidden, M, H, 256, 8, tw_buf, TW_R_16BF), NULL);
    OK(twCreateHybrid(&hidden_hy, M, H, 32, M, hy_buf, TW_R_16BF), NULL);

    OK(twSpGEMMFused_bufferSize(h, ffn_row, X, Y1, &ws_bytes), h);
    OK(twSpGEMMFused_bufferSize(h, ffn_col, X, Y2, &n), h);
    if (n > ws_bytes) ws_bytes = n;
    ws = ws_bytes ? malloc(ws_bytes) : NULL;
    if (failures) return 1;

    OK(twSpGEMMFused(h, ffn_row, X, Y1, hidden, ws), h);
    OK(twSpGEMMFused(h, ffn_col, X, Y2, hidden_hy, ws), h);
    worst_row = check_output(y1, "Wd TW_ORDER_ROW against the double reference");
    worst_col = check_output(y2, "Wd TW_ORDER_COL against the double reference");
    for (i = 0; i < M * D; ++i) {
        const double a = from_bf16(y1[i]), b = from_bf16(y2[i]);
        const double tol = 4.0 / 256.0 * (y_mag[i / D][i % D] + fabs(y_ref[i / D][i % D])) + 1e-6;
        if (!(fabs(a - b) <= tol)) {
            fail("Wd TW_ORDER_ROW and TW_ORDER_COL give different results");
            break;
        }
    }

    { /* the TwELL hidden recorded the heavy row; the hybrid one holds h exactly in structure */
        twSpMatInfo_t info;
        twFfnStats_t stats;
        int64_t most = 0, least_max = 0, counts[H];
        if (OK(twSpMatGetInfo(h, hidden, &info), h) && (info.overflowRows < 1 || info.overflowRows > M))
            fail("the TwELL hidden should record the heavy row as an overflow row");
        if (twSparseToDense(h, hidden, Hd) != TW_STATUS_INCOMPLETE_INPUT)
            fail("twSparseToDense of an overflowed TwELL should give INCOMPLETE_INPUT");
        if (OK(twSparseToDense(h, hidden_hy, Hd), h))
            for (t = 0; t < M; ++t)
                for (j = 0; j < H; ++j) {
                    const double got = from_bf16(hdense[t * H + j]), want = h_ref[t][j];
                    if (g_ref[t][j] <= 0 ? got != 0.0 : !(fabs(got - want) <= 4.0 / 256.0 * fabs(want) + 1e-6)) {
                        fprintf(stderr, "  h[%d][%d] = %g, expected %g\n", t, j, got, want);
                        fail("hidden activations");
                        t = M;
                        break;
                    }
                }
        for (t = 0; t < M; ++t) {
            int64_t gate = 0, nonzero = 0;
            for (j = 0; j < H; ++j) {
                gate += g_ref[t][j] > 0;
                nonzero += h_ref[t][j] != 0;
            }
            if (gate > most) most = gate;
            if (nonzero > least_max) least_max = nonzero;
        }
        if (most < H * 9 / 10) fail("test problem: the heavy row should have most units active");
        if (OK(twFfnGetStats(h, ffn_col, &stats), h)) {
            if (stats.tokens != M) fail("twFfnGetStats: tokens");
            if (stats.maxRowNnz < least_max || stats.maxRowNnz > most) fail("twFfnGetStats: maxRowNnz");
        }
        if (OK(twFfnGetNeuronCounts(h, ffn_col, counts), h))
            for (j = 0; j < H; ++j) { /* tokens activating unit j: gate > 0 (h != 0 at least) */
                int64_t gate = 0, nonzero = 0;
                for (t = 0; t < M; ++t) {
                    gate += g_ref[t][j] > 0;
                    nonzero += h_ref[t][j] != 0;
                }
                if (counts[j] < nonzero || counts[j] > gate || (dead(j) && counts[j] != 0)) {
                    fprintf(stderr, "  unit %d: count %lld, expected %lld\n", j, (long long)counts[j],
                            (long long)gate);
                    fail("twFfnGetNeuronCounts");
                    break;
                }
            }
    }

    /* Bad inputs: a status and a message, never a crash; Y untouched. */
    OK(twCreateDnMat(&Xbad, M, D + 1, D + 1, hdense, TW_R_16BF, TW_ORDER_ROW), NULL); /* M * H >= M * (D + 1) */
    memcpy(y1, poison, sizeof y1);
    expect(twSpGEMMFused(h, ffn_row, Xbad, Y1, NULL, ws), TW_STATUS_INVALID_VALUE, h, "X with D + 1 columns");
    if (strlen(twGetErrorMessage(h)) == 0) fail("no error message for X with D + 1 columns");
    if (memcmp(y1, poison, sizeof y1) != 0) fail("a failing twSpGEMMFused wrote Y");
    expect(twCreateFfn(h, &ffn_bad, TW_FFN_GATED_RELU, NULL, Wu, WdRow), TW_STATUS_INVALID_VALUE, h,
           "gated FFN without wGate");
    expect(twCreateFfn(h, &ffn_bad, TW_FFN_GATED_RELU, Wg, Wu, X), TW_STATUS_INVALID_VALUE, h,
           "wDown of the wrong shape");
    if (ffn_bad != NULL) fail("a failing twCreateFfn set *ffn");
    expect(twSpGEMMFused(NULL, ffn_row, X, Y1, NULL, ws), TW_STATUS_NOT_INITIALIZED, NULL, "NULL handle");
    expect(twCreateDnMat(&Xbad, M, D, D - 1, xb, TW_R_16BF, TW_ORDER_ROW), TW_STATUS_INVALID_VALUE, NULL,
           "ld < cols");

    OK(twDestroyFfn(ffn_row), NULL);
    OK(twDestroyFfn(ffn_col), NULL);
    OK(twDestroySpMat(hidden), NULL);
    OK(twDestroySpMat(hidden_hy), NULL);
    OK(twDestroyDnMat(X), NULL);
    OK(twDestroyDnMat(Xbad), NULL);
    OK(twDestroyDnMat(Wg), NULL);
    OK(twDestroyDnMat(Wu), NULL);
    OK(twDestroyDnMat(WdRow), NULL);
    OK(twDestroyDnMat(WdCol), NULL);
    OK(twDestroyDnMat(Y1), NULL);
    OK(twDestroyDnMat(Y2), NULL);
    OK(twDestroyDnMat(Hd), NULL);
    OK(twDestroy(h), NULL);
    free(ws);
    free(tw_buf);
    free(hy_buf);

    if (failures) {
        fprintf(stderr, "consumer: %d check(s) failed\n", failures);
        return 1;
    }
    printf("consumer: twblas %d.%d.%d, all checks passed (worst error / tolerance: row %.3f, col %.3f)\n",
           TWBLAS_VERSION_MAJOR, TWBLAS_VERSION_MINOR, TWBLAS_VERSION_PATCH, worst_row, worst_col);
    return 0;
}
