/**
 * @file twblas.h
 * @brief twblas: sparse feed-forward linear algebra (TwELL and hybrid formats), C API.
 *
 * One umbrella header, valid C99 and C++, needing no CUDA header (streams travel as void*).
 * Conventions (cuSPARSE mould):
 *  - every function returns a ::twStatus_t; sizes and dimensions are int64_t;
 *  - every twCreateX has a twDestroyX; destroying NULL succeeds; a NULL, destroyed or foreign
 *    object gives ::TW_STATUS_NOT_INITIALIZED, never a crash;
 *  - stale objects: handles and descriptors are bare pointers, so a destroyed object is only
 *    recognisable while no new object has its address. twblas keeps the memory of the last 1024
 *    destroyed objects of each kind (handles, dense, sparse and FFN descriptors; a few hundred
 *    bytes each, released at once: a destroy frees everything the object owns), so no new
 *    object takes their addresses: using or destroying one of them again gives
 *    NOT_INITIALIZED, and the message says it was destroyed. Beyond those 1024, as with
 *    cuSPARSE, using a destroyed object is undefined: its address may belong to a newer object
 *    of the same kind, which the call would then use (or destroy);
 *  - descriptors never own user memory; pointers live where the handle's backend computes
 *    (host memory for ::TW_BACKEND_CPU, device memory for ::TW_BACKEND_CUDA);
 *  - alignment (INVALID_VALUE otherwise): dense values to their element size (4 bytes for
 *    TW_R_32F, 2 for the 16-bit types); TwELL buffers to 4 bytes, hybrid buffers to 16
 *    (docs/formats.md); workspaces and saved training state to 256 bytes on the CUDA backend
 *    and 16 bytes on the CPU backend; int64 outputs (neuron counts) to 8. cudaMalloc (256) and
 *    malloc (16) give every one of these;
 *  - memory that a call writes must not overlap memory that it reads or another of its outputs
 *    (INVALID_VALUE naming the output): byte ranges are compared, so two descriptors over
 *    overlapping memory count. The one exception is Y == X in the fused forwards (the same
 *    values, ld and order: in place);
 *  - sizes: a byte count that does not fit size_t is INVALID_VALUE naming the argument that
 *    makes it (the _bufferSize queries and the create calls check before computing);
 *  - zero-sized problems succeed without touching any pointer (NULL is fine there);
 *  - compute calls never allocate device memory and never synchronise; scratch comes from the
 *    caller through a *_bufferSize function and a workspace pointer;
 *  - bad arguments give ::TW_STATUS_INVALID_VALUE and leave every output untouched;
 *    twGetErrorMessage() names the argument and the reason;
 *  - threads (docs/api-guide.md, section 9): a handle is used by one thread at a time (one per
 *    thread: they are cheap); dense and sparse descriptors are immutable and may be read by any
 *    number of calls at once; an FFN descriptor may be shared by threads, handles and streams
 *    for every compute call, twFfnGetStats, twFfnGetNeuronCounts and twFfnResetNeuronCounts
 *    (neuron counts exact; the statistics are those of the forward that published last), but
 *    not while twFfnSetAttribute, twFfnUpdateWeights or twDestroyFfn run on it; calls that may
 *    run at the same time must not write the same memory (outputs, workspaces, saved states).
 * Formats: docs/formats.md (bit-level TwELL and hybrid layouts).
 */
#ifndef TWBLAS_TWBLAS_H
#define TWBLAS_TWBLAS_H

#include <stddef.h>
#include <stdint.h>

#include "twblas/twblas_export.h"
#include "twblas/twblas_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/** @name Core */
/**@{*/

/** Status of every call. */
typedef enum {
    TW_STATUS_SUCCESS = 0,               /**< the call did what it was asked */
    TW_STATUS_NOT_INITIALIZED = 1,       /**< NULL, destroyed or foreign handle/descriptor */
    TW_STATUS_ALLOC_FAILED = 2,          /**< a setup call could not allocate memory */
    TW_STATUS_INVALID_VALUE = 3,         /**< bad argument: pointer, dimension, layout, enum */
    TW_STATUS_ARCH_MISMATCH = 4,         /**< the device lacks what the routine needs */
    TW_STATUS_EXECUTION_FAILED = 5,      /**< a kernel or vendor-library call failed */
    TW_STATUS_INTERNAL_ERROR = 6,        /**< a bug in twblas; please report it */
    TW_STATUS_NOT_SUPPORTED = 7,         /**< valid, but not built or not supported */
    TW_STATUS_INSUFFICIENT_WORKSPACE = 8,/**< the workspace given is smaller than needed */
    TW_STATUS_CAPACITY_EXCEEDED = 9,     /**< a sparse container was too small (formats.md) */
    TW_STATUS_INCOMPLETE_INPUT = 10      /**< a sparse input records rows it could not hold
                                              (formats.md): no exact result exists */
} twStatus_t;

/** Name of a status, e.g. "TW_STATUS_INVALID_VALUE"; "TW_STATUS_<unknown>" for other values. */
TWBLAS_API const char *twGetStatusName(twStatus_t status);
/** One-sentence description of a status. */
TWBLAS_API const char *twGetStatusString(twStatus_t status);

/** Library context: backend, stream, last error message. One per thread or stream. */
typedef struct twContext *twHandle_t;

/** Where a handle computes. */
typedef enum {
    TW_BACKEND_DEFAULT = 0, /**< CUDA when built with it and a usable GPU is present, else CPU */
    TW_BACKEND_CPU = 1,     /**< the Eigen reference backend (host memory) */
    TW_BACKEND_CUDA = 2     /**< the CUDA backend (device memory) */
} twBackend_t;

/** Creates a handle on the default backend. Returns SUCCESS, INVALID_VALUE (handle NULL),
 *  ALLOC_FAILED. */
TWBLAS_API twStatus_t twCreate(twHandle_t *handle);
/** Creates a handle on a named backend. TW_BACKEND_CUDA gives NOT_SUPPORTED when the library
 *  was built without CUDA or no usable GPU is present. */
TWBLAS_API twStatus_t twCreateWithBackend(twHandle_t *handle, twBackend_t backend);
/** Destroys a handle; NULL is a no-op. Returns SUCCESS or NOT_INITIALIZED (a destroyed handle:
 *  see "stale objects" at the top of this file). */
TWBLAS_API twStatus_t twDestroy(twHandle_t handle);
/** The backend a handle computes on (never TW_BACKEND_DEFAULT). */
TWBLAS_API twStatus_t twGetBackend(twHandle_t handle, twBackend_t *backend);
/** Sets the cudaStream_t every call of this handle uses (NULL: the handle's own default);
 *  stored but unused on the CPU backend. */
TWBLAS_API twStatus_t twSetStream(twHandle_t handle, void *stream);
/** The stream set with twSetStream (NULL if none). */
TWBLAS_API twStatus_t twGetStream(twHandle_t handle, void **stream);
/** Detail of the last failed call on this handle ("" if none). With handle NULL (or a handle
 *  that is not valid): the last failure on this thread of a call that had no valid handle,
 *  such as twCreateDnMat. The string stays valid until the next failing call. */
TWBLAS_API const char *twGetErrorMessage(twHandle_t handle);
/** MAJOR*10000 + MINOR*100 + PATCH. */
TWBLAS_API twStatus_t twGetVersion(int *version);

/** Value types. Sparse containers hold 16-bit values (TwELL) or 16/32-bit values (hybrid). */
typedef enum {
    TW_R_32F = 0,  /**< IEEE fp32 */
    TW_R_16F = 1,  /**< IEEE fp16 (16-bit pattern) */
    TW_R_16BF = 2  /**< bfloat16 (16-bit pattern) */
} twDataType_t;
/** Storage order of a dense matrix: ROW = row-major (ld >= cols), COL = column-major
 *  (ld >= rows). */
typedef enum {
    TW_ORDER_ROW = 0,  /**< row-major: element (r, c) at r * ld + c */
    TW_ORDER_COL = 1   /**< column-major: element (r, c) at c * ld + r */
} twOrder_t;
/**@}*/

/* ------------------------------------------------------------------------------------------ */
/** @name Descriptors */
/**@{*/

/** Dense matrix descriptor: logical rows x cols, stored in `order` with leading dimension ld. */
typedef struct twDnMatDescr *twDnMatDescr_t;
/** Describes user memory (not owned). values may be NULL only when rows*cols == 0; a non-NULL
 *  values must be aligned to the element size (4 bytes for TW_R_32F, 2 for TW_R_16F and
 *  TW_R_16BF), and the matrix's bytes (lines x ld elements) must fit the address space.
 *  Returns SUCCESS, INVALID_VALUE (negative sizes, ld too small, NULL or misaligned values,
 *  a size that overflows, bad enum), ALLOC_FAILED. */
TWBLAS_API twStatus_t twCreateDnMat(twDnMatDescr_t *descr, int64_t rows, int64_t cols,
                                    int64_t ld, void *values, twDataType_t valueType,
                                    twOrder_t order);
/** Destroys a dense descriptor (not the memory it describes); NULL is a no-op. A destroyed
 *  descriptor gives NOT_INITIALIZED (see "stale objects" at the top of this file). */
TWBLAS_API twStatus_t twDestroyDnMat(twDnMatDescr_t descr);
/** Reads a dense descriptor back. Any output pointer may be NULL. */
TWBLAS_API twStatus_t twDnMatGet(twDnMatDescr_t descr, int64_t *rows, int64_t *cols,
                                 int64_t *ld, void **values, twDataType_t *valueType,
                                 twOrder_t *order);

/** Sparse matrix descriptor (TwELL or hybrid) over a user buffer. */
typedef struct twSpMatDescr *twSpMatDescr_t;
/** Sparse storage formats (docs/formats.md). */
typedef enum {
    TW_FORMAT_TWELL = 0,  /**< tile-wise ELLPACK: one packed uint32 matrix */
    TW_FORMAT_HYBRID = 1  /**< ELL rows + dense backup rows */
} twFormat_t;

/** Bytes of a TwELL buffer: rows x NT*W uint32 words (NT = ceil(cols/T), W = T/C) followed by
 *  the overflow record (a uint32 row count and up to `rows` uint32 row ids).
 *  tileWidth in {64, 128, 256}, compression in {2, 4, 8}; cols <= 65536 and rows <= INT32_MAX
 *  (else NOT_SUPPORTED); a size that does not fit size_t is INVALID_VALUE. */
TWBLAS_API twStatus_t twTwellBufferSize(int64_t rows, int64_t cols, int32_t tileWidth,
                                        int32_t compression, size_t *bytes);
/** Describes a TwELL buffer of twTwellBufferSize bytes (4-byte aligned: INVALID_VALUE
 *  otherwise). Values are 16-bit (TW_R_16BF or TW_R_16F; TW_R_32F is NOT_SUPPORTED). The buffer
 *  content is not read. The same size checks as twTwellBufferSize. */
TWBLAS_API twStatus_t twCreateTwell(twSpMatDescr_t *descr, int64_t rows, int64_t cols,
                                    int32_t tileWidth, int32_t compression, void *buffer,
                                    twDataType_t valueType);

/** Bytes of a hybrid buffer: row_nnz, ELL part (E entries a row), backup record and B dense
 *  backup rows (docs/formats.md). ellWidth: a positive multiple of 8 (it may exceed cols);
 *  0 <= backupRows <= rows; cols <= 65536 and rows <= INT32_MAX (else NOT_SUPPORTED). A size
 *  that does not fit size_t is INVALID_VALUE naming ellWidth (ELL part) or backupRows. */
TWBLAS_API twStatus_t twHybridBufferSize(int64_t rows, int64_t cols, int32_t ellWidth,
                                         int64_t backupRows, twDataType_t valueType,
                                         size_t *bytes);
/** Describes a hybrid buffer of twHybridBufferSize bytes (16-byte aligned: INVALID_VALUE
 *  otherwise). Values: TW_R_16BF, TW_R_16F or TW_R_32F. The buffer content is not read. The
 *  same size checks as twHybridBufferSize. */
TWBLAS_API twStatus_t twCreateHybrid(twSpMatDescr_t *descr, int64_t rows, int64_t cols,
                                     int32_t ellWidth, int64_t backupRows, void *buffer,
                                     twDataType_t valueType);

/** Destroys a sparse descriptor (not its buffer); NULL is a no-op. A destroyed descriptor gives
 *  NOT_INITIALIZED (see "stale objects" at the top of this file). */
TWBLAS_API twStatus_t twDestroySpMat(twSpMatDescr_t descr);
/** Format of a sparse descriptor. */
TWBLAS_API twStatus_t twSpMatGetFormat(twSpMatDescr_t descr, twFormat_t *format);
/** Logical size of a sparse descriptor. Either output may be NULL. */
TWBLAS_API twStatus_t twSpMatGetSize(twSpMatDescr_t descr, int64_t *rows, int64_t *cols);
/** Buffer and value type of a sparse descriptor. Either output may be NULL. */
TWBLAS_API twStatus_t twSpMatGetBuffer(twSpMatDescr_t descr, void **buffer,
                                       twDataType_t *valueType);

/** Content counts of a sparse matrix, read back to the host (blocking). */
typedef struct {
    int64_t nnz;           /**< stored + backed-up non-zeros */
    int64_t maxRowNnz;     /**< largest true row count (TwELL: of the stored entries) */
    int64_t overflowRows;  /**< rows that did not fit the compact part (TwELL tile or ELL width);
                                for a hybrid, rows beyond backupRows are not stored at all */
    int64_t droppedValues; /**< always 0: twblas offers no discarding policy */
} twSpMatInfo_t;
/** Reads the counts of a filled sparse matrix (blocking). */
TWBLAS_API twStatus_t twSpMatGetInfo(twHandle_t handle, twSpMatDescr_t descr,
                                     twSpMatInfo_t *info);
/** Checks every invariant of docs/formats.md on the buffer. SUCCESS when valid, else
 *  INVALID_VALUE with the first violation (row, tile, slot) in twGetErrorMessage(). */
TWBLAS_API twStatus_t twSpMatValidate(twHandle_t handle, twSpMatDescr_t descr);
/**@}*/

/* ------------------------------------------------------------------------------------------ */
/** @name Conversion (three phases, like cusparseDenseToSparse) */
/**@{*/

/** What a conversion applies on the way: PLAIN keeps every value whose bit pattern is not
 *  +0 (so dense -> sparse -> dense is bit-exact, -0.0 included); RELU keeps values > 0 and NaN
 *  (as torch.relu does). */
typedef enum {
    TW_CONVERT_PLAIN = 0,  /**< keep every non-zero bit pattern */
    TW_CONVERT_RELU = 1    /**< keep values > 0 and NaN */
} twConvertOp_t;

/** Workspace bytes for the conversion of `in` (dense) into `out` (TwELL or hybrid). */
TWBLAS_API twStatus_t twDenseToSparse_bufferSize(twHandle_t h, twDnMatDescr_t in,
                                                 twSpMatDescr_t out, twConvertOp_t op,
                                                 size_t *bytes);
/** Counts the non-zeros of every row into the workspace (setup call: may block). The buffer of
 *  `out` and the workspace must not overlap the memory of `in` (INVALID_VALUE). Returns
 *  CAPACITY_EXCEEDED when `out` cannot hold them (TwELL tile overflow; hybrid needing more
 *  than backupRows dense rows); the conversion may still be run and records the same. */
TWBLAS_API twStatus_t twDenseToSparse_analysis(twHandle_t h, twDnMatDescr_t in,
                                               twSpMatDescr_t out, twConvertOp_t op,
                                               void *workspace);
/** Writes `out` from `in` (after _analysis on the same workspace). Values and types must
 *  match (no rounding). CAPACITY_EXCEEDED when rows did not fit; `out` then records them
 *  (twSpMatGetInfo) and holds every row that did. */
TWBLAS_API twStatus_t twDenseToSparse_convert(twHandle_t h, twDnMatDescr_t in,
                                              twSpMatDescr_t out, twConvertOp_t op,
                                              void *workspace);
/** Writes every element of `out` (same size and value type). INCOMPLETE_INPUT, with `out`
 *  untouched, when `in` records rows that it could not hold (the result would not be exact).
 *  `out` must not overlap the buffer of `in` (INVALID_VALUE). On the CUDA backend the call
 *  waits for the verdict only: `out` is written in the handle's stream order, as a compute call's
 *  output is. */
TWBLAS_API twStatus_t twSparseToDense(twHandle_t h, twSpMatDescr_t in, twDnMatDescr_t out);
/** Re-packs a sparse matrix into another container of the same size and value type
 *  (TwELL -> hybrid, hybrid -> TwELL, or between parameters). CAPACITY_EXCEEDED as for
 *  twDenseToSparse_convert when `out` cannot hold every row (`out` records them);
 *  INCOMPLETE_INPUT, with `out` untouched, when `in` records rows that it could not hold. The
 *  two buffers must not overlap (INVALID_VALUE). */
TWBLAS_API twStatus_t twSparseConvert(twHandle_t h, twSpMatDescr_t in, twSpMatDescr_t out);
/** out = in^T (in: rows x cols, out: cols x rows; same value type). The columns of `out`
 *  are the rows of `in`, hence rows of `in` <= 65536. CAPACITY_EXCEEDED as for
 *  twDenseToSparse_convert when `out` cannot hold the transposed rows; INCOMPLETE_INPUT, with
 *  `out` untouched, when `in` records rows that it could not hold. The two buffers must not
 *  overlap (INVALID_VALUE). */
TWBLAS_API twStatus_t twSparseTranspose(twHandle_t h, twSpMatDescr_t in, twSpMatDescr_t out);
/**@}*/

/* ------------------------------------------------------------------------------------------ */
/** @name Fused sparse feed-forward */
/**@{*/

/** A feed-forward layer: where its weights are, their attributes and statistics. */
typedef struct twFfnDescr *twFfnDescr_t;
/** Gated: Y = (ReLU(X Wg^T) * (X Wu^T)) Wd; plain: Y = ReLU(X Wu^T) Wd. */
typedef enum {
    TW_FFN_GATED_RELU = 0,  /**< Y = (ReLU(X Wg^T) * (X Wu^T)) Wd */
    TW_FFN_RELU = 1         /**< Y = ReLU(X Wu^T) Wd */
} twFfnKind_t;

/** Setup: validates the weights (each logical H x D; Wd TW_ORDER_COL is nn.Linear's
 *  down_proj.weight) and records where they are (may allocate and block).
 *
 *  Like a cuSPARSE descriptor, the FFN refers to the caller's memory: on the CUDA backend the
 *  kernels read a weight matrix in place, with no copy, when it is in their own layout:
 *  TW_ORDER_ROW (row j holds unit j's D values: nn.Linear's gate_proj.weight and up_proj.weight;
 *  for Wd, down_proj.weight viewed transposed, i.e. an H x D row-major storage), D a multiple
 *  of 8, the base address 16-byte aligned and ld * element size a multiple of 16 bytes. Any
 *  other matrix (Wd TW_ORDER_COL as nn.Linear stores it, an odd D, a misaligned base or ld) is
 *  copied into the FFN's own memory instead, H x roundup(D, 8) elements of the value type per
 *  copied matrix; the results are the same either way. TW_FFN_ATTR_WEIGHT_COPY_BYTES tells how
 *  many bytes of copies an FFN holds (0 when every weight is read in place). The CPU backend
 *  keeps an fp32 copy of every weight (it is the reference), 4 x H x D bytes per matrix.
 *
 *  Weights read in place must stay allocated, unmoved, for the FFN's lifetime (until
 *  twDestroyFfn, or until twFfnUpdateWeights points it elsewhere), and compute calls read their
 *  values as they are when the kernels run: a training loop that updates the weights in place
 *  needs no twFfnUpdateWeights (the FP8 copy of TW_COMPUTE_FP8_WEIGHTS is refreshed by it). Outputs of compute calls (Y, dX, the weight gradients) must not
 *  overlap them (INVALID_VALUE). Copied weights keep the values they had at this call (or at
 *  the last twFfnUpdateWeights). */
TWBLAS_API twStatus_t twCreateFfn(twHandle_t h, twFfnDescr_t *ffn, twFfnKind_t kind,
                                  twDnMatDescr_t wGate /* NULL for TW_FFN_RELU */,
                                  twDnMatDescr_t wUp, twDnMatDescr_t wDown);
/** Points the FFN at new weight descriptors of the same shapes and types (or the same ones
 *  again, after their values changed): weights in the kernels' layout (twCreateFfn) are then
 *  read in place from the new memory, and the others are copied again. Weights read in place
 *  need this call only when their memory moves; copied ones whenever their values change. The
 *  FP8 copy of TW_COMPUTE_FP8_WEIGHTS is made again by the next forward in that mode either way.
 *  On the CUDA backend a copy runs on the handle's stream without blocking, so calls on that
 *  stream after it use the new weights (it may be captured in a CUDA graph, except when the
 *  new weights need copies of a different layout than before, which allocates and blocks:
 *  NOT_SUPPORTED during a capture); work on other streams must be ordered after it (an event),
 *  and copied weights must keep their values until it has run. Re-pointing in place is host
 *  state only: the FFN's own captured calls follow it, a caller's CUDA graph captured before it
 *  keeps the old addresses. Not while compute calls on this FFN run (the thread rules above). */
TWBLAS_API twStatus_t twFfnUpdateWeights(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t wGate,
                                         twDnMatDescr_t wUp, twDnMatDescr_t wDown);
/** Destroys an FFN descriptor and the weight copies it holds (the caller's weights are left as
 *  they are; free them after this call); NULL is a no-op. A destroyed descriptor gives
 *  NOT_INITIALIZED (see "stale objects" at the top of this file). */
TWBLAS_API twStatus_t twDestroyFfn(twFfnDescr_t ffn);
/** Model dimension D and hidden dimension H of an FFN. Either output may be NULL. */
TWBLAS_API twStatus_t twFfnGetSize(twFfnDescr_t ffn, int64_t *modelDim, int64_t *hiddenDim);

/** FFN attributes (twFfnSetAttribute / twFfnGetAttribute). */
typedef enum {
    TW_FFN_ATTR_TILE_WIDTH = 0,    /**< int32, 64/128/256, default 256: TwELL tile of the path */
    TW_FFN_ATTR_COMPRESSION = 1,   /**< int32, 2/4/8, default 8 */
    TW_FFN_ATTR_COMPUTE_MODE = 2,  /**< twComputeMode_t (stored as int32) */
    TW_FFN_ATTR_DETERMINISTIC = 3, /**< int32 0/1: bitwise identical results run to run */
    TW_FFN_ATTR_SAVE_DENSE = 4,    /**< twSaveDense_t (stored as int32), default
                                        TW_SAVE_DENSE_AUTO: room in the saved state for g and u
                                        of every token (see twSpGEMMFusedSaved_bufferSize) */
    TW_FFN_ATTR_L1_OUTPUT = 5,     /**< float *, backend memory, 4-byte aligned, default NULL:
                                        where every forward also writes its l1 (below) */
    TW_FFN_ATTR_L1_COEFF_POINTER = 6, /**< const float *, backend memory, 4-byte aligned, default
                                        NULL: where the backward reads l1Coeff (below) */
    TW_FFN_ATTR_CALL_GRAPHS = 7,   /**< int32 0/1, default 1: twSpGEMMFused on CUDA captures the
                                        kernels of an argument set seen twice into a CUDA graph
                                        and replays it (one graph launch of host time a call);
                                        0: every call launches its kernels (below) */
    TW_FFN_ATTR_WEIGHT_COPY_BYTES = 8, /**< int64, read-only (twFfnGetAttribute; set:
                                        INVALID_VALUE): bytes of weight copies the FFN holds in
                                        the backend's memory: 0 when every weight is read in
                                        place (twCreateFfn); the TW_COMPUTE_FP8_WEIGHTS copy
                                        counts from when that mode is set */
    TW_FFN_ATTR_ALGORITHM = 9      /**< twFfnAlgorithm_t (stored as int32), default
                                        TW_FFN_ALG_DEFAULT: the forward's path (below) */
} twFfnAttribute_t;
/** The forward's algorithms (TW_FFN_ATTR_ALGORITHM), as cuSPARSE's `alg` arguments: DEFAULT
 *  chooses per call from the shape, the mode and the sparsity the last forward measured (the CUDA
 *  backend's paths below); the others pin one path, for tests and for users who know their
 *  workload. Every algorithm gives the same results within the mode's rounding (their sums run
 *  in different orders), each the same bits run to run in deterministic mode, exact for any
 *  sparsity. A pinned algorithm
 *  that cannot run a call returns TW_STATUS_NOT_SUPPORTED from it, naming what it lacks, before
 *  anything is written; M = 0 returns at once whatever the algorithm. The CPU backend has one
 *  algorithm, the reference, and runs it for every value. */
typedef enum {
    TW_FFN_ALG_DEFAULT = 0,         /**< the library chooses, call by call */
    TW_FFN_ALG_SERVE = 1,           /**< the gate on tensor cores with unit masks, then gathers of
                                         each active unit's rows (inference, 16-bit or FP8) */
    TW_FFN_ALG_DECODE = 2,          /**< one kernel for gate, unit choice and projections: 1 to 4
                                         tokens, 16-bit DEFAULT, D <= 4096, inference */
    TW_FFN_ALG_DENSE = 3,           /**< the projections as dense cuBLAS GEMMs over every row (16-bit
                                         DEFAULT, not deterministic) */
    TW_FFN_ALG_FUSED = 4,           /**< gate GEMM, then one kernel per token over its active units
                                         (inference, not FP8) */
    TW_FFN_ALG_TWO_PASS = 5,        /**< gate GEMM, then u per active unit and y by column slices */
    TW_FFN_ALG_MASKED_TWO_PASS = 6  /**< the gate GEMM writes active-unit masks in its epilogue
                                         (sm_90a builds on sm_90 GPUs, 16-bit), then two passes */
} twFfnAlgorithm_t;
/** TW_FFN_ATTR_SAVE_DENSE's values: whether a training forward in dense mode keeps g and u of
 *  every token for its backward (twSpGEMMFusedSaved_bufferSize says what each costs). */
typedef enum {
    TW_SAVE_DENSE_NEVER = 0,  /**< never: the backward of a dense-mode step recomputes them */
    TW_SAVE_DENSE_ALWAYS = 1, /**< room for them in every saved state */
    TW_SAVE_DENSE_AUTO = 2    /**< room when the next training forward will run in dense mode */
} twSaveDense_t;
/** The two pointer attributes let a training loop run without reading anything back per layer
 *  (a framework's l1 output and the l1 gradient it receives both live on the device):
 *  - TW_FFN_ATTR_L1_OUTPUT: when not NULL, twSpGEMMFused and twSpGEMMFusedForwardTrain with
 *    M > 0 also write the forward's l1 (twFfnStats_t's l1, rounded to float) to that address, in
 *    stream order, without blocking. M = 0 writes nothing there.
 *  - TW_FFN_ATTR_L1_COEFF_POINTER: when not NULL, twSpGEMMFusedBackward ignores its l1Coeff
 *    argument and reads l1Coeff from that address when it runs, in stream order (the CPU backend:
 *    during the call). That value is not checked: a non-finite one gives non-finite gradients.
 *  Both addresses are taken when a call is made (a captured CUDA graph keeps the addresses it
 *  was captured with); NULL turns either off. A CUDA FFN needs device-accessible addresses
 *  (INVALID_VALUE from the call otherwise, before anything is written).
 *  TW_FFN_ATTR_CALL_GRAPHS: a capture runs on a private stream for tens of microseconds, once per
 *  argument set; CUDA refuses cudaDeviceSynchronize from any thread while it runs (and the
 *  driver has been seen to crash in it). A program whose threads synchronise the whole device
 *  while others call twblas eagerly sets 0. The CPU backend takes the value and ignores it. */
/** DEFAULT rounds g, u, h to the value type as dense PyTorch does; HIGHEST_PRECISION keeps
 *  every intermediate in fp32. Accumulation is fp32 or better in both. */
typedef enum {
    TW_COMPUTE_DEFAULT = 0,            /**< intermediates rounded as dense PyTorch does */
    TW_COMPUTE_HIGHEST_PRECISION = 1,  /**< fp32 intermediates */
    TW_COMPUTE_FP8_WEIGHTS = 2         /**< opt-in, inference only: the sparse part's weights in FP8 */
} twComputeMode_t;
/** TW_COMPUTE_FP8_WEIGHTS: the rows of the units a token uses are read as FP8 E4M3 with one fp32
 *  scale per row: for unit j and each of its rows w (Wu_j of a gated FFN, and Wd_j), s = max|w| /
 *  448 (1 for a row of zeros) and w is used as e4m3(w / s) * s (round to nearest even,
 *  saturating). The gate (Wg, or Wu of a plain ReLU FFN) keeps the value type, so the active
 *  units are exactly DEFAULT's; g, u and h are rounded as in DEFAULT. Where dense GEMMs beat
 *  gathers the CUDA backend reads the 16-bit weights instead, and those tokens' y is DEFAULT's:
 *  tokens on its dense path (more active units than max(H / 32, 64), or a TwELL tile over
 *  capacity), and every token of a forward that runs dense (after one whose tokens averaged more
 *  than H / 128 active units; TW_FFN_ATTR_ALGORITHM pins a sparse path instead). Each weight changes by at
 *  most 2^-4 of itself (or 2^-10 s below 2^-6 s), so y moves by a few per cent of its norm from
 *  DEFAULT's (docs/api-guide.md gives the measured figures). 16-bit FFNs only (an fp32 FFN:
 *  NOT_SUPPORTED from twFfnSetAttribute); twSpGEMMFused only (the training calls:
 *  NOT_SUPPORTED); both backends (CUDA takes the FP8 copy's memory when the mode is set:
 *  TW_STATUS_ALLOC_FAILED leaves it unchanged). The FP8 copy is the FFN's own, also when the
 *  16-bit weights are read in place: on CUDA H x (roundup(D, 16) x 2 + 8) bytes gated, H x
 *  (roundup(D, 16) + 8) plain (TW_FFN_ATTR_WEIGHT_COPY_BYTES counts it), kept until the FFN is
 *  destroyed. Never on by default. */
/** Sets an attribute; size must be sizeof(int32_t), or sizeof(void *) for the pointer
 *  attributes (value points to the pointer). TW_FFN_ATTR_WEIGHT_COPY_BYTES is read-only. */
TWBLAS_API twStatus_t twFfnSetAttribute(twFfnDescr_t ffn, twFfnAttribute_t attr,
                                        const void *value, size_t size);
/** Reads an attribute; size as for twFfnSetAttribute. */
TWBLAS_API twStatus_t twFfnGetAttribute(twFfnDescr_t ffn, twFfnAttribute_t attr, void *value,
                                        size_t size);
/** Tuning knobs of the backend's path choice, by name (docs/api-guide.md lists them with their
 *  defaults): the crossovers between the CUDA forward's paths and the switches of their variants,
 *  so that a benchmark compares two settings in one process. Results do not depend on them (only
 *  speed does). Setup calls, under the thread rules of twFfnSetAttribute; a captured call graph
 *  of the FFN follows the new values. Unknown name or value out of range: INVALID_VALUE; the CPU
 *  backend has no knobs: NOT_SUPPORTED. */
TWBLAS_API twStatus_t twFfnSetTuning(twFfnDescr_t ffn, const char *name, double value);
TWBLAS_API twStatus_t twFfnGetTuning(twFfnDescr_t ffn, const char *name, double *value);

/** Workspace bytes for twSpGEMMFused with these X and Y (0 when M = 0). M <= INT32_MAX tokens
 *  per call (token ids are 32-bit; INVALID_VALUE naming X beyond). */
TWBLAS_API twStatus_t twSpGEMMFused_bufferSize(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
                                               twDnMatDescr_t Y, size_t *bytes);
/** Forward (inference): Y = FFN(X). X, Y: M x D, the weights' value type. hidden: optional
 *  (NULL) M x H TwELL or hybrid descriptor that receives h, rounded to the container's own value
 *  type; rows it cannot hold are recorded in it (twSpMatGetInfo) and Y stays exact. Exact for
 *  any sparsity pattern. The workspace size comes from twSpGEMMFused_bufferSize; its alignment
 *  is 256 bytes on CUDA, 16 on CPU. Y may be X itself (the same values, ld and order: an
 *  in-place forward); any other overlap between X, Y, hidden's buffer and the workspace is
 *  INVALID_VALUE. M = 0 returns SUCCESS without touching any pointer.
 *
 *  Non-finite values: unit j is active for a token when its ReLU input g (X Wg^T gated,
 *  X Wu^T plain, rounded as the compute mode says) is > 0 or NaN; +0 and -0 are inactive. An
 *  inactive unit contributes an exact zero, even when its u, its Wu row or its Wd row holds Inf
 *  or NaN (dense IEEE math would give 0 * Inf = NaN): they are not read for that token.
 *  ReLU(NaN) is NaN, as in torch.relu: a unit whose g is NaN is active (counted in the
 *  statistics) and its NaN h propagates to the token's whole row of Y. The CPU backend holds this
 *  for every token, the CUDA backend for the tokens of its sparse path only: the tokens it
 *  computes densely (a TwELL tile over capacity, very many active units, or dense projections
 *  chosen by a non-deterministic FFN) multiply the zero h of inactive units by their Wd rows,
 *  so there a non-finite Wd row gives NaN. */
TWBLAS_API twStatus_t twSpGEMMFused(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
                                    twDnMatDescr_t Y, twSpMatDescr_t hidden, void *workspace);

/** Activation statistics of the last forward on an FFN (blocking). */
typedef struct {
    int64_t tokens;       /**< M of the last forward */
    double meanRowNnz;    /**< L0 per token */
    int64_t maxRowNnz;    /**< most active units of one token */
    int64_t overflowRows; /**< rows with a TwELL tile over capacity: the exact dense path */
    double l1;            /**< sum over tokens and units of |h|, divided by tokens */
} twFfnStats_t;
/** Reads the statistics of the last forward (twSpGEMMFused or twSpGEMMFusedForwardTrain) on
 *  this FFN; zeros before the first. Blocking. */
TWBLAS_API twStatus_t twFfnGetStats(twHandle_t h, twFfnDescr_t ffn, twFfnStats_t *stats);

/** Per-neuron activation counts since the last reset (H int64 values into backend memory,
 *  8-byte aligned). */
TWBLAS_API twStatus_t twFfnGetNeuronCounts(twHandle_t h, twFfnDescr_t ffn, int64_t *counts);
/** Sets the per-neuron counts to zero. */
TWBLAS_API twStatus_t twFfnResetNeuronCounts(twHandle_t h, twFfnDescr_t ffn);
/**@}*/

/* ------------------------------------------------------------------------------------------ */
/** @name Training */
/**@{*/

/** Bytes of the saved state for `tokens` tokens (the backend's compact format: ELL rows of the
 *  gate pattern with g and u; rows too dense for it are recomputed from X in the backward).
 *  Both backends: at most 128 units per token are kept, about 1/14 of a dense bf16 h at H = 5632.
 *
 *  Dense mode (CUDA, 16-bit, not deterministic): a training forward after one that found the
 *  activations too dense for the sparse path (as at the start of training, before the L1 term
 *  has made them sparse) runs as the dense step does. Its backward is the dense step's too when
 *  the saved state has room for g and u of every token in the value type (4 x tokens x H bytes
 *  more for a gated bf16 FFN, 2 x for TW_FFN_RELU: 2/3 of what a dense step keeps, [g | u] and
 *  h); without it the backward recomputes them from X (two GEMMs more, so slower than the dense
 *  step). TW_FFN_ATTR_SAVE_DENSE chooses:
 *  - TW_SAVE_DENSE_AUTO (default): the room is in the answer when the FFN's latest statistics put
 *    the next training forward of `tokens` tokens in dense mode, so the answer changes as the
 *    activations do. The FFN remembers the answer: its next training forwards of `tokens` tokens
 *    keep g and u there while in dense mode. Query the size before each training forward (as a
 *    framework that allocates the saved state per step does; a size queried once before training
 *    stays valid, but its steps then recompute); the saved state must have at least the bytes of
 *    the latest query on this FFN for these tokens (from the thread that then runs the forward).
 *  - TW_SAVE_DENSE_ALWAYS: the room is always there (dense mode or not).
 *  - TW_SAVE_DENSE_NEVER: never; dense-mode backwards recompute.
 *  The results agree either way up to rounding; a saved state moved to another address before
 *  its backward is still read correctly, through the recompute. The CPU backend ignores the
 *  attribute. 0 bytes for tokens = 0; tokens <= INT32_MAX (INVALID_VALUE beyond: token ids are
 *  32-bit, and the bound keeps every size inside size_t). */
TWBLAS_API twStatus_t twSpGEMMFusedSaved_bufferSize(twHandle_t h, twFfnDescr_t ffn,
                                                    int64_t tokens, size_t *bytes);
/** Forward that also writes what the backward needs into `saved` (twSpGEMMFusedSaved_bufferSize
 *  bytes, backend memory, aligned as a workspace: 256 bytes on CUDA, 16 on CPU); workspace as
 *  for twSpGEMMFused. Updates the FFN's statistics. Y may be X as in twSpGEMMFused (but the
 *  backward needs the forward's X); `saved` must not overlap X, Y or the workspace.
 *  M = 0 returns SUCCESS at once: nothing is written (saved and workspace may be NULL), and the
 *  statistics keep those of the last forward, as twSpGEMMFused with M = 0 does. */
TWBLAS_API twStatus_t twSpGEMMFusedForwardTrain(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
                                                twDnMatDescr_t Y, void *saved, void *workspace);
/** Workspace bytes for twSpGEMMFusedBackward (CUDA: room for every token to be recomputed, so
 *  that no call needs a host synchronisation; about 1.2 GB at M = 16384, D = 2048, H = 5632).
 *  0 for tokens = 0; tokens <= INT32_MAX as for twSpGEMMFusedSaved_bufferSize. */
TWBLAS_API twStatus_t twSpGEMMFusedBackward_bufferSize(twHandle_t h, twFfnDescr_t ffn,
                                                       int64_t tokens, size_t *bytes);
/** dX (M x D) and dWgate, dWup, dWdown (each logical H x D, any order; dWgate NULL for
 *  TW_FFN_RELU) from X, the saved state of the forward on X, and dY. Outputs are overwritten.
 *  l1Coeff adds l1Coeff * d(mean_t sum_j |h_tj|) (the paper's L1 regulariser); with
 *  TW_FFN_ATTR_L1_COEFF_POINTER set it is read from there instead. No output may
 *  overlap an input (X, dY, saved), another output or the workspace (INVALID_VALUE naming it);
 *  saved and workspace are aligned as for twSpGEMMFusedForwardTrain.
 *  M = 0: the weight gradients are set to zero (they are overwritten, and no token contributes);
 *  X, dY, dX, saved and workspace are not touched (saved and workspace may be NULL).
 *  Non-finite values as for twSpGEMMFused: an inactive unit adds exact zeros to dX and to its
 *  rows of the weight gradients, whatever its u, Wu and Wd rows hold (CUDA: tokens of the
 *  sparse path; the tokens it recomputes densely multiply the zero gradients of inactive units
 *  by their Wu rows into dX). A unit whose g is NaN propagates NaN. The CPU backend checks all
 *  of `saved` before use: a unit count, unit id or g that its forward cannot have written gives
 *  INVALID_VALUE naming the token, with every output untouched. The CUDA backend cannot return a
 *  status that depends on device data without a synchronisation: it clamps or skips every count
 *  and unit id of `saved` it reads, so a corrupted state never faults, but its results are then
 *  meaningless (the violation is not reported). */
TWBLAS_API twStatus_t twSpGEMMFusedBackward(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
                                            const void *saved, twDnMatDescr_t dY, float l1Coeff,
                                            twDnMatDescr_t dX, twDnMatDescr_t dWgate,
                                            twDnMatDescr_t dWup, twDnMatDescr_t dWdown,
                                            void *workspace);
/**@}*/

/* ------------------------------------------------------------------------------------------ */
/** @name Building blocks */
/**@{*/

/** Workspace bytes for twGemmToSparse. */
TWBLAS_API twStatus_t twGemmToSparse_bufferSize(twHandle_t h, twDnMatDescr_t A, twDnMatDescr_t B,
                                                twSpMatDescr_t C, twConvertOp_t act,
                                                size_t *bytes);
/** C = act(alpha * A B^T) into a TwELL or hybrid C (A: M x K, B: N x K, C: M x N), rounded to
 *  C's own value type. Rows C cannot hold are recorded in C (compute call: no status depends on
 *  the data). C's buffer and the workspace must not overlap A, B or each other (INVALID_VALUE). */
TWBLAS_API twStatus_t twGemmToSparse(twHandle_t h, float alpha, twDnMatDescr_t A,
                                     twDnMatDescr_t B, twSpMatDescr_t C, twConvertOp_t act,
                                     void *workspace);
/** Workspace bytes for twSpMM. */
TWBLAS_API twStatus_t twSpMM_bufferSize(twHandle_t h, twSpMatDescr_t S, twDnMatDescr_t W,
                                        twDnMatDescr_t Y, size_t *bytes);
/** Y = alpha * S W + beta * Y (S: M x K sparse of any value type, W: K x N, Y: M x N of one
 *  type); beta == 0 does not read Y. When S records rows it could not hold: the CPU backend
 *  returns INCOMPLETE_INPUT with Y untouched; the CUDA backend, which cannot read S's record
 *  without synchronising, writes those rows of Y as NaN (never a partial sum) and
 *  twSpMatGetInfo(S).overflowRows counts them. Y must not overlap S's buffer, W or the workspace
 *  (INVALID_VALUE; Y itself is read and written in place when beta != 0). */
TWBLAS_API twStatus_t twSpMM(twHandle_t h, float alpha, twSpMatDescr_t S, twDnMatDescr_t W,
                             float beta, twDnMatDescr_t Y, void *workspace);
/**@}*/

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TWBLAS_TWBLAS_H */
