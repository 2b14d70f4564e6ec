/*
 * ffn_example.c: a sparse gated feed-forward layer with the twblas C API.
 *
 *   Y = (ReLU(X Wg^T) * (X Wu^T)) Wd        X, Y: M x D tokens, Wg, Wu, Wd: H x D
 *
 * Steps: create a handle, describe bf16 weights laid out as PyTorch's nn.Linear stores them,
 * create the FFN, query and allocate the workspace, run the fused forward with a TwELL
 * `hidden` output that receives the sparse activations h, read the statistics back, check Y
 * against a naive float computation, clean up.
 *
 * The handle uses the CPU backend, so every pointer is host memory. With TW_BACKEND_CUDA the
 * same calls take device pointers (cudaMalloc + cudaMemcpy), the workspace included.
 *
 * Build, against the Debian packages or a prefix install (for the latter, first
 * export PKG_CONFIG_PATH=<prefix>/lib/pkgconfig; the rpath finds libtwblas.so.0 there at run time):
 *   cc ffn_example.c $(pkg-config --cflags --libs twblas) -lm -Wl,-rpath,$(pkg-config --variable=libdir twblas) -o ffn_example
 * or with CMake: find_package(twblas) and twblas::twblas. scripts/package.sh builds it with this line.
 * Returns 0 on success, 1 on any failed call or a wrong result.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <twblas/twblas.h>

/* Every call returns a status: on failure print its name and the library's explanation of
 * what was wrong, then jump to the clean-up code. A call that takes no handle (twCreateDnMat,
 * twCreateTwell, twCreate itself) leaves its message with the thread: twGetErrorMessage(NULL). */
static const char *last_error(twHandle_t handle) {
    const char *msg = twGetErrorMessage(handle);
    return (msg && *msg) ? msg : twGetErrorMessage(NULL);
}

#define CHECK(call)                                                                     \
    do {                                                                                \
        twStatus_t st_ = (call);                                                        \
        if (st_ != TW_STATUS_SUCCESS) {                                                 \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,    \
                    twGetStatusName(st_), last_error(handle));                          \
            goto cleanup;                                                               \
        }                                                                               \
    } while (0)

/* ---- bf16 helpers: a bf16 value is the upper 16 bits of an IEEE fp32 ------------------- */
static float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Rounds to nearest, ties to even (as PyTorch's .to(torch.bfloat16)). */
static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

/* Deterministic uniform numbers in [-1, 1) (a 32-bit LCG), so every run is the same. */
static float uniform(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / 8388608.0f - 1.0f;
}

enum { M = 16, D = 64, H = 512, TILE = 256, COMPRESSION = 8 };

int main(void) {
    twHandle_t handle = NULL;
    twDnMatDescr_t dX = NULL, dY = NULL, dWg = NULL, dWu = NULL, dWd = NULL;
    twSpMatDescr_t hidden = NULL;
    twFfnDescr_t ffn = NULL;
    void *workspace = NULL, *hiddenBuf = NULL;
    uint16_t *x = NULL, *y = NULL, *wg = NULL, *wu = NULL, *wd = NULL;
    float *yRef = NULL;
    int ok = 0;
    int version = 0, i, m, d, j;
    size_t workBytes = 0, hiddenBytes = 0;
    uint32_t rng = 12345u;

    x = malloc(sizeof *x * M * D);
    y = malloc(sizeof *y * M * D);
    wg = malloc(sizeof *wg * H * D);
    wu = malloc(sizeof *wu * H * D);
    wd = malloc(sizeof *wd * D * H);
    yRef = calloc((size_t)M * D, sizeof *yRef);
    if (!x || !y || !wg || !wu || !wd || !yRef) {
        fprintf(stderr, "out of host memory\n");
        goto cleanup;
    }

    /* ---- data ---------------------------------------------------------------------------
     * Feature 0 of every token is a constant 1, so column 0 of Wg acts as a negative bias:
     * about 5 % of the hidden units fire for a token, like a trained ReLU FFN.
     * Layouts as in PyTorch: X [M, D], gate_proj.weight and up_proj.weight [H, D], and
     * down_proj.weight [D, H], all row-major. */
    for (m = 0; m < M; ++m)
        for (d = 0; d < D; ++d) x[m * D + d] = float_to_bf16(d == 0 ? 1.0f : uniform(&rng));
    for (j = 0; j < H; ++j)
        for (d = 0; d < D; ++d) {
            wg[j * D + d] = float_to_bf16(d == 0 ? -0.55f : 0.125f * uniform(&rng));
            wu[j * D + d] = float_to_bf16(0.125f * uniform(&rng));
        }
    for (d = 0; d < D; ++d)
        for (j = 0; j < H; ++j) wd[d * H + j] = float_to_bf16(0.5f * uniform(&rng));

    /* ---- handle, descriptors, FFN ---------------------------------------------------------- */
    CHECK(twGetVersion(&version));
    printf("twblas %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
    CHECK(twCreateWithBackend(&handle, TW_BACKEND_CPU));

    CHECK(twCreateDnMat(&dX, M, D, D, x, TW_R_16BF, TW_ORDER_ROW));
    CHECK(twCreateDnMat(&dY, M, D, D, y, TW_R_16BF, TW_ORDER_ROW));
    /* Every weight is described as its logical H x D matrix. gate/up_proj.weight are that
     * matrix row-major; down_proj.weight ([D, H] row-major) is it column-major, ld = H. */
    CHECK(twCreateDnMat(&dWg, H, D, D, wg, TW_R_16BF, TW_ORDER_ROW));
    CHECK(twCreateDnMat(&dWu, H, D, D, wu, TW_R_16BF, TW_ORDER_ROW));
    CHECK(twCreateDnMat(&dWd, H, D, H, wd, TW_R_16BF, TW_ORDER_COL));
    CHECK(twCreateFfn(handle, &ffn, TW_FFN_GATED_RELU, dWg, dWu, dWd));

    /* The M x H activations h in TwELL: 256-column tiles, 31 entries each at compression 8. */
    CHECK(twTwellBufferSize(M, H, TILE, COMPRESSION, &hiddenBytes));
    hiddenBuf = malloc(hiddenBytes);
    if (!hiddenBuf) goto cleanup;
    CHECK(twCreateTwell(&hidden, M, H, TILE, COMPRESSION, hiddenBuf, TW_R_16BF));

    /* Compute calls never allocate: the caller provides the scratch memory. */
    CHECK(twSpGEMMFused_bufferSize(handle, ffn, dX, dY, &workBytes));
    workspace = malloc(workBytes > 0 ? workBytes : 1);
    if (!workspace) goto cleanup;

    /* ---- forward ----------------------------------------------------------------------------- */
    CHECK(twSpGEMMFused(handle, ffn, dX, dY, hidden, workspace));

    {
        twFfnStats_t stats;
        twSpMatInfo_t info;
        CHECK(twFfnGetStats(handle, ffn, &stats));
        CHECK(twSpMatGetInfo(handle, hidden, &info));
        printf("forward: M = %d tokens, D = %d, H = %d, workspace %zu bytes, hidden %zu bytes\n",
               M, D, H, workBytes, hiddenBytes);
        printf("stats:  tokens %lld, mean active units %.2f (%.1f %%), max %lld, "
               "overflow rows %lld, l1 %.4f\n",
               (long long)stats.tokens, stats.meanRowNnz, 100.0 * stats.meanRowNnz / H,
               (long long)stats.maxRowNnz, (long long)stats.overflowRows, stats.l1);
        printf("hidden: nnz %lld, max row nnz %lld, overflow rows %lld, dropped %lld\n",
               (long long)info.nnz, (long long)info.maxRowNnz, (long long)info.overflowRows,
               (long long)info.droppedValues);

        /* ---- check against a naive float computation ---------------------------------------
         * The default compute mode rounds g, u and h to bf16 as dense PyTorch does; so does
         * this reference. Accumulation is in float. */
        {
            long long refNnz = 0, refOverflow = 0;
            float maxErr = 0.0f, maxRef = 0.0f;
            for (m = 0; m < M; ++m) {
                int tileCount[(H + TILE - 1) / TILE] = {0};
                int overflow = 0;
                for (j = 0; j < H; ++j) {
                    float g = 0.0f, u = 0.0f, h;
                    for (d = 0; d < D; ++d) {
                        g += bf16_to_float(x[m * D + d]) * bf16_to_float(wg[j * D + d]);
                        u += bf16_to_float(x[m * D + d]) * bf16_to_float(wu[j * D + d]);
                    }
                    g = round_bf16(g);
                    u = round_bf16(u);
                    h = round_bf16((g > 0.0f ? g : 0.0f) * u);
                    if (h == 0.0f) continue;
                    ++refNnz;
                    ++tileCount[j / TILE];
                    for (d = 0; d < D; ++d) yRef[m * D + d] += h * bf16_to_float(wd[d * H + j]);
                }
                for (i = 0; i < (H + TILE - 1) / TILE; ++i)
                    if (tileCount[i] > TILE / COMPRESSION - 1) overflow = 1;
                refOverflow += overflow;
            }
            for (i = 0; i < M * D; ++i) {
                float err = fabsf(bf16_to_float(y[i]) - round_bf16(yRef[i]));
                if (err > maxErr) maxErr = err;
                if (fabsf(yRef[i]) > maxRef) maxRef = fabsf(yRef[i]);
            }
            printf("Y[0][0..3] = %.4g %.4g %.4g %.4g (reference %.4g %.4g %.4g %.4g)\n",
                   bf16_to_float(y[0]), bf16_to_float(y[1]), bf16_to_float(y[2]),
                   bf16_to_float(y[3]), yRef[0], yRef[1], yRef[2], yRef[3]);
            printf("max |Y - ref| / max |ref| = %.3g\n", maxRef > 0 ? maxErr / maxRef : maxErr);

            /* bf16 keeps 8 significant bits: allow a couple of roundings of difference. */
            if (maxRef == 0.0f || maxErr > 1e-2f * maxRef) {
                fprintf(stderr, "FAIL: Y differs from the reference\n");
                goto cleanup;
            }
            if (stats.tokens != M || info.overflowRows != refOverflow ||
                (refOverflow == 0 && info.nnz != refNnz)) {
                fprintf(stderr, "FAIL: counts differ (tokens %lld, overflow rows %lld vs %lld, "
                        "nnz %lld vs %lld)\n", (long long)stats.tokens,
                        (long long)info.overflowRows, refOverflow, (long long)info.nnz, refNnz);
                goto cleanup;
            }
        }
    }
    ok = 1;
    printf("PASS\n");

cleanup:
    /* Destroying NULL is a no-op, so this runs whatever step failed. */
    twDestroySpMat(hidden);
    twDestroyFfn(ffn);
    twDestroyDnMat(dX);
    twDestroyDnMat(dY);
    twDestroyDnMat(dWg);
    twDestroyDnMat(dWu);
    twDestroyDnMat(dWd);
    twDestroy(handle);
    free(workspace);
    free(hiddenBuf);
    free(x);
    free(y);
    free(wg);
    free(wu);
    free(wd);
    free(yRef);
    return ok ? 0 : 1;
}
