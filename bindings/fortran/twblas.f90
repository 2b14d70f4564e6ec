!> @file twblas.f90
!> @brief Fortran 2018 bindings of the twblas C API (include/twblas/twblas.h).
!>
!> `use twblas` gives:
!>  - every enumerator of twblas.h as an integer(c_int) parameter with the same name and value
!>    (TW_STATUS_SUCCESS, TW_BACKEND_CPU, TW_R_32F, TW_ORDER_ROW, TW_FFN_ATTR_DETERMINISTIC, ...);
!>  - the bind(c) derived types twSpMatInfo_t and twFfnStats_t;
!>  - an iso_c_binding interface for every function of twblas.h, under the C name. Every one is
!>    a function returning the status as integer(c_int) (except the three that return strings,
!>    which return type(c_ptr); use tw_status_name, tw_status_string and tw_error_message);
!>  - convenience module procedures: tw_status_name, tw_status_string, tw_error_message,
!>    tw_c_string, tw_ffn_set_attribute_i32 and tw_ffn_get_attribute_i32.
!>
!> Mapping of the C types:
!>  - handles and descriptors (twHandle_t, twDnMatDescr_t, twSpMatDescr_t, twFfnDescr_t) are
!>    type(c_ptr): passed by value where C takes the object, by reference (intent(out)) where C
!>    takes a pointer to it (the twCreateX functions);
!>  - enums are integer(c_int), passed by value; enum outputs are integer(c_int), intent(out);
!>  - int64_t is integer(c_int64_t), int32_t integer(c_int32_t), size_t integer(c_size_t),
!>    float real(c_float);
!>  - data pointers (void*: matrix values, buffers, workspaces, streams, saved state, attribute
!>    values, neuron counts) are type(c_ptr), value, so that device memory of the CUDA backend
!>    can be passed as well as host memory (c_loc(array) of a contiguous, target array);
!>  - outputs that C documents as "may be NULL" (twDnMatGet, twSpMatGetSize, twSpMatGetBuffer,
!>    twFfnGetSize) are optional dummies: an absent argument is passed as NULL.
!>
!> Storage order: a Fortran array a(n, m) is column-major; it is the row-major m x n matrix
!> with ld = n (TW_ORDER_ROW), or the column-major n x m matrix with ld = n (TW_ORDER_COL).
module twblas
    use, intrinsic :: iso_c_binding
    implicit none
    private

    ! ---- twStatus_t ---------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_STATUS_SUCCESS = 0
    integer(c_int), parameter, public :: TW_STATUS_NOT_INITIALIZED = 1
    integer(c_int), parameter, public :: TW_STATUS_ALLOC_FAILED = 2
    integer(c_int), parameter, public :: TW_STATUS_INVALID_VALUE = 3
    integer(c_int), parameter, public :: TW_STATUS_ARCH_MISMATCH = 4
    integer(c_int), parameter, public :: TW_STATUS_EXECUTION_FAILED = 5
    integer(c_int), parameter, public :: TW_STATUS_INTERNAL_ERROR = 6
    integer(c_int), parameter, public :: TW_STATUS_NOT_SUPPORTED = 7
    integer(c_int), parameter, public :: TW_STATUS_INSUFFICIENT_WORKSPACE = 8
    integer(c_int), parameter, public :: TW_STATUS_CAPACITY_EXCEEDED = 9
    integer(c_int), parameter, public :: TW_STATUS_INCOMPLETE_INPUT = 10

    ! ---- twBackend_t --------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_BACKEND_DEFAULT = 0
    integer(c_int), parameter, public :: TW_BACKEND_CPU = 1
    integer(c_int), parameter, public :: TW_BACKEND_CUDA = 2

    ! ---- twDataType_t -------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_R_32F = 0
    integer(c_int), parameter, public :: TW_R_16F = 1
    integer(c_int), parameter, public :: TW_R_16BF = 2

    ! ---- twOrder_t ----------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_ORDER_ROW = 0
    integer(c_int), parameter, public :: TW_ORDER_COL = 1

    ! ---- twFormat_t ---------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_FORMAT_TWELL = 0
    integer(c_int), parameter, public :: TW_FORMAT_HYBRID = 1

    ! ---- twConvertOp_t ------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_CONVERT_PLAIN = 0
    integer(c_int), parameter, public :: TW_CONVERT_RELU = 1

    ! ---- twFfnKind_t --------------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_FFN_GATED_RELU = 0
    integer(c_int), parameter, public :: TW_FFN_RELU = 1

    ! ---- twFfnAttribute_t ---------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_FFN_ATTR_TILE_WIDTH = 0
    integer(c_int), parameter, public :: TW_FFN_ATTR_COMPRESSION = 1
    integer(c_int), parameter, public :: TW_FFN_ATTR_COMPUTE_MODE = 2
    integer(c_int), parameter, public :: TW_FFN_ATTR_DETERMINISTIC = 3
    integer(c_int), parameter, public :: TW_FFN_ATTR_SAVE_DENSE = 4
    integer(c_int), parameter, public :: TW_FFN_ATTR_L1_OUTPUT = 5
    integer(c_int), parameter, public :: TW_FFN_ATTR_L1_COEFF_POINTER = 6
    integer(c_int), parameter, public :: TW_FFN_ATTR_CALL_GRAPHS = 7
    integer(c_int), parameter, public :: TW_FFN_ATTR_WEIGHT_COPY_BYTES = 8  !< int64, read-only
    integer(c_int), parameter, public :: TW_FFN_ATTR_ALGORITHM = 9

    ! ---- twFfnAlgorithm_t ---------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_FFN_ALG_DEFAULT = 0
    integer(c_int), parameter, public :: TW_FFN_ALG_SERVE = 1
    integer(c_int), parameter, public :: TW_FFN_ALG_DECODE = 2
    integer(c_int), parameter, public :: TW_FFN_ALG_DENSE = 3
    integer(c_int), parameter, public :: TW_FFN_ALG_FUSED = 4
    integer(c_int), parameter, public :: TW_FFN_ALG_TWO_PASS = 5
    integer(c_int), parameter, public :: TW_FFN_ALG_MASKED_TWO_PASS = 6

    ! ---- twSaveDense_t (TW_FFN_ATTR_SAVE_DENSE) ---------------------------------------------------
    integer(c_int), parameter, public :: TW_SAVE_DENSE_NEVER = 0
    integer(c_int), parameter, public :: TW_SAVE_DENSE_ALWAYS = 1
    integer(c_int), parameter, public :: TW_SAVE_DENSE_AUTO = 2

    ! ---- twComputeMode_t ----------------------------------------------------------------------
    integer(c_int), parameter, public :: TW_COMPUTE_DEFAULT = 0
    integer(c_int), parameter, public :: TW_COMPUTE_HIGHEST_PRECISION = 1
    integer(c_int), parameter, public :: TW_COMPUTE_FP8_WEIGHTS = 2

    !> Content counts of a sparse matrix (twSpMatGetInfo).
    type, bind(c), public :: twSpMatInfo_t
        integer(c_int64_t) :: nnz = 0            !< stored + backed-up non-zeros
        integer(c_int64_t) :: maxRowNnz = 0      !< largest true row count
        integer(c_int64_t) :: overflowRows = 0   !< rows that did not fit the compact part
        integer(c_int64_t) :: droppedValues = 0  !< always 0
    end type twSpMatInfo_t

    !> Activation statistics of the last forward on an FFN (twFfnGetStats).
    type, bind(c), public :: twFfnStats_t
        integer(c_int64_t) :: tokens = 0         !< M of the last forward
        real(c_double) :: meanRowNnz = 0         !< L0 per token
        integer(c_int64_t) :: maxRowNnz = 0      !< most active units of one token
        integer(c_int64_t) :: overflowRows = 0   !< rows that took the exact dense path
        real(c_double) :: l1 = 0                 !< sum of |h| over tokens and units / tokens
    end type twFfnStats_t

    public :: twGetStatusName, twGetStatusString, twCreate, twCreateWithBackend, twDestroy
    public :: twGetBackend, twSetStream, twGetStream, twGetErrorMessage, twGetVersion
    public :: twCreateDnMat, twDestroyDnMat, twDnMatGet
    public :: twTwellBufferSize, twCreateTwell, twHybridBufferSize, twCreateHybrid
    public :: twDestroySpMat, twSpMatGetFormat, twSpMatGetSize, twSpMatGetBuffer
    public :: twSpMatGetInfo, twSpMatValidate
    public :: twDenseToSparse_bufferSize, twDenseToSparse_analysis, twDenseToSparse_convert
    public :: twSparseToDense, twSparseConvert, twSparseTranspose
    public :: twCreateFfn, twFfnUpdateWeights, twDestroyFfn, twFfnGetSize
    public :: twFfnSetAttribute, twFfnGetAttribute, twFfnSetTuning, twFfnGetTuning
    public :: twSpGEMMFused_bufferSize, twSpGEMMFused, twFfnGetStats
    public :: twFfnGetNeuronCounts, twFfnResetNeuronCounts
    public :: twSpGEMMFusedSaved_bufferSize, twSpGEMMFusedForwardTrain
    public :: twSpGEMMFusedBackward_bufferSize, twSpGEMMFusedBackward
    public :: twGemmToSparse_bufferSize, twGemmToSparse, twSpMM_bufferSize, twSpMM
    public :: tw_c_string, tw_status_name, tw_status_string, tw_error_message
    public :: tw_ffn_set_attribute_i32, tw_ffn_get_attribute_i32

    interface
        ! ==== Core ================================================================================

        !> const char *twGetStatusName(twStatus_t status)
        function twGetStatusName(status) bind(c, name='twGetStatusName') result(str)
            import :: c_int, c_ptr
            integer(c_int), value :: status
            type(c_ptr) :: str
        end function twGetStatusName

        !> const char *twGetStatusString(twStatus_t status)
        function twGetStatusString(status) bind(c, name='twGetStatusString') result(str)
            import :: c_int, c_ptr
            integer(c_int), value :: status
            type(c_ptr) :: str
        end function twGetStatusString

        !> twStatus_t twCreate(twHandle_t *handle)
        function twCreate(handle) bind(c, name='twCreate') result(status)
            import :: c_int, c_ptr
            type(c_ptr), intent(out) :: handle
            integer(c_int) :: status
        end function twCreate

        !> twStatus_t twCreateWithBackend(twHandle_t *handle, twBackend_t backend)
        function twCreateWithBackend(handle, backend) bind(c, name='twCreateWithBackend') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), intent(out) :: handle
            integer(c_int), value :: backend
            integer(c_int) :: status
        end function twCreateWithBackend

        !> twStatus_t twDestroy(twHandle_t handle)
        function twDestroy(handle) bind(c, name='twDestroy') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: handle
            integer(c_int) :: status
        end function twDestroy

        !> twStatus_t twGetBackend(twHandle_t handle, twBackend_t *backend)
        function twGetBackend(handle, backend) bind(c, name='twGetBackend') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: handle
            integer(c_int), intent(out) :: backend
            integer(c_int) :: status
        end function twGetBackend

        !> twStatus_t twSetStream(twHandle_t handle, void *stream)
        function twSetStream(handle, stream) bind(c, name='twSetStream') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: handle
            type(c_ptr), value :: stream
            integer(c_int) :: status
        end function twSetStream

        !> twStatus_t twGetStream(twHandle_t handle, void **stream)
        function twGetStream(handle, stream) bind(c, name='twGetStream') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: handle
            type(c_ptr), intent(out) :: stream
            integer(c_int) :: status
        end function twGetStream

        !> const char *twGetErrorMessage(twHandle_t handle)
        function twGetErrorMessage(handle) bind(c, name='twGetErrorMessage') result(str)
            import :: c_ptr
            type(c_ptr), value :: handle
            type(c_ptr) :: str
        end function twGetErrorMessage

        !> twStatus_t twGetVersion(int *version)
        function twGetVersion(version) bind(c, name='twGetVersion') result(status)
            import :: c_int
            integer(c_int), intent(out) :: version
            integer(c_int) :: status
        end function twGetVersion

        ! ==== Descriptors =========================================================================

        !> twStatus_t twCreateDnMat(twDnMatDescr_t *descr, int64_t rows, int64_t cols, int64_t ld,
        !>                          void *values, twDataType_t valueType, twOrder_t order)
        function twCreateDnMat(descr, rows, cols, ld, values, valueType, order) &
                bind(c, name='twCreateDnMat') result(status)
            import :: c_int, c_int64_t, c_ptr
            type(c_ptr), intent(out) :: descr
            integer(c_int64_t), value :: rows, cols, ld
            type(c_ptr), value :: values
            integer(c_int), value :: valueType, order
            integer(c_int) :: status
        end function twCreateDnMat

        !> twStatus_t twDestroyDnMat(twDnMatDescr_t descr)
        function twDestroyDnMat(descr) bind(c, name='twDestroyDnMat') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: descr
            integer(c_int) :: status
        end function twDestroyDnMat

        !> twStatus_t twDnMatGet(twDnMatDescr_t descr, int64_t *rows, int64_t *cols, int64_t *ld,
        !>                       void **values, twDataType_t *valueType, twOrder_t *order)
        !> Every output is optional (absent: NULL).
        function twDnMatGet(descr, rows, cols, ld, values, valueType, order) &
                bind(c, name='twDnMatGet') result(status)
            import :: c_int, c_int64_t, c_ptr
            type(c_ptr), value :: descr
            integer(c_int64_t), intent(out), optional :: rows, cols, ld
            type(c_ptr), intent(out), optional :: values
            integer(c_int), intent(out), optional :: valueType, order
            integer(c_int) :: status
        end function twDnMatGet

        !> twStatus_t twTwellBufferSize(int64_t rows, int64_t cols, int32_t tileWidth,
        !>                              int32_t compression, size_t *bytes)
        function twTwellBufferSize(rows, cols, tileWidth, compression, bytes) &
                bind(c, name='twTwellBufferSize') result(status)
            import :: c_int, c_int32_t, c_int64_t, c_size_t
            integer(c_int64_t), value :: rows, cols
            integer(c_int32_t), value :: tileWidth, compression
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twTwellBufferSize

        !> twStatus_t twCreateTwell(twSpMatDescr_t *descr, int64_t rows, int64_t cols,
        !>                          int32_t tileWidth, int32_t compression, void *buffer,
        !>                          twDataType_t valueType)
        function twCreateTwell(descr, rows, cols, tileWidth, compression, buffer, valueType) &
                bind(c, name='twCreateTwell') result(status)
            import :: c_int, c_int32_t, c_int64_t, c_ptr
            type(c_ptr), intent(out) :: descr
            integer(c_int64_t), value :: rows, cols
            integer(c_int32_t), value :: tileWidth, compression
            type(c_ptr), value :: buffer
            integer(c_int), value :: valueType
            integer(c_int) :: status
        end function twCreateTwell

        !> twStatus_t twHybridBufferSize(int64_t rows, int64_t cols, int32_t ellWidth,
        !>                               int64_t backupRows, twDataType_t valueType, size_t *bytes)
        function twHybridBufferSize(rows, cols, ellWidth, backupRows, valueType, bytes) &
                bind(c, name='twHybridBufferSize') result(status)
            import :: c_int, c_int32_t, c_int64_t, c_size_t
            integer(c_int64_t), value :: rows, cols
            integer(c_int32_t), value :: ellWidth
            integer(c_int64_t), value :: backupRows
            integer(c_int), value :: valueType
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twHybridBufferSize

        !> twStatus_t twCreateHybrid(twSpMatDescr_t *descr, int64_t rows, int64_t cols,
        !>                           int32_t ellWidth, int64_t backupRows, void *buffer,
        !>                           twDataType_t valueType)
        function twCreateHybrid(descr, rows, cols, ellWidth, backupRows, buffer, valueType) &
                bind(c, name='twCreateHybrid') result(status)
            import :: c_int, c_int32_t, c_int64_t, c_ptr
            type(c_ptr), intent(out) :: descr
            integer(c_int64_t), value :: rows, cols
            integer(c_int32_t), value :: ellWidth
            integer(c_int64_t), value :: backupRows
            type(c_ptr), value :: buffer
            integer(c_int), value :: valueType
            integer(c_int) :: status
        end function twCreateHybrid

        !> twStatus_t twDestroySpMat(twSpMatDescr_t descr)
        function twDestroySpMat(descr) bind(c, name='twDestroySpMat') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: descr
            integer(c_int) :: status
        end function twDestroySpMat

        !> twStatus_t twSpMatGetFormat(twSpMatDescr_t descr, twFormat_t *format)
        function twSpMatGetFormat(descr, format) bind(c, name='twSpMatGetFormat') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: descr
            integer(c_int), intent(out) :: format
            integer(c_int) :: status
        end function twSpMatGetFormat

        !> twStatus_t twSpMatGetSize(twSpMatDescr_t descr, int64_t *rows, int64_t *cols)
        !> Both outputs are optional (absent: NULL).
        function twSpMatGetSize(descr, rows, cols) bind(c, name='twSpMatGetSize') result(status)
            import :: c_int, c_int64_t, c_ptr
            type(c_ptr), value :: descr
            integer(c_int64_t), intent(out), optional :: rows, cols
            integer(c_int) :: status
        end function twSpMatGetSize

        !> twStatus_t twSpMatGetBuffer(twSpMatDescr_t descr, void **buffer,
        !>                             twDataType_t *valueType)
        !> Both outputs are optional (absent: NULL).
        function twSpMatGetBuffer(descr, buffer, valueType) bind(c, name='twSpMatGetBuffer') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: descr
            type(c_ptr), intent(out), optional :: buffer
            integer(c_int), intent(out), optional :: valueType
            integer(c_int) :: status
        end function twSpMatGetBuffer

        !> twStatus_t twSpMatGetInfo(twHandle_t handle, twSpMatDescr_t descr,
        !>                           twSpMatInfo_t *info)
        function twSpMatGetInfo(handle, descr, info) bind(c, name='twSpMatGetInfo') result(status)
            import :: c_int, c_ptr, twSpMatInfo_t
            type(c_ptr), value :: handle, descr
            type(twSpMatInfo_t), intent(out) :: info
            integer(c_int) :: status
        end function twSpMatGetInfo

        !> twStatus_t twSpMatValidate(twHandle_t handle, twSpMatDescr_t descr)
        function twSpMatValidate(handle, descr) bind(c, name='twSpMatValidate') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: handle, descr
            integer(c_int) :: status
        end function twSpMatValidate

        ! ==== Conversion ==========================================================================

        !> twStatus_t twDenseToSparse_bufferSize(twHandle_t h, twDnMatDescr_t in,
        !>                                       twSpMatDescr_t out, twConvertOp_t op,
        !>                                       size_t *bytes)
        function twDenseToSparse_bufferSize(h, in, out, op, bytes) &
                bind(c, name='twDenseToSparse_bufferSize') result(status)
            import :: c_int, c_ptr, c_size_t
            type(c_ptr), value :: h, in, out
            integer(c_int), value :: op
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twDenseToSparse_bufferSize

        !> twStatus_t twDenseToSparse_analysis(twHandle_t h, twDnMatDescr_t in,
        !>                                     twSpMatDescr_t out, twConvertOp_t op,
        !>                                     void *workspace)
        function twDenseToSparse_analysis(h, in, out, op, workspace) &
                bind(c, name='twDenseToSparse_analysis') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, in, out
            integer(c_int), value :: op
            type(c_ptr), value :: workspace
            integer(c_int) :: status
        end function twDenseToSparse_analysis

        !> twStatus_t twDenseToSparse_convert(twHandle_t h, twDnMatDescr_t in,
        !>                                    twSpMatDescr_t out, twConvertOp_t op,
        !>                                    void *workspace)
        function twDenseToSparse_convert(h, in, out, op, workspace) &
                bind(c, name='twDenseToSparse_convert') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, in, out
            integer(c_int), value :: op
            type(c_ptr), value :: workspace
            integer(c_int) :: status
        end function twDenseToSparse_convert

        !> twStatus_t twSparseToDense(twHandle_t h, twSpMatDescr_t in, twDnMatDescr_t out)
        function twSparseToDense(h, in, out) bind(c, name='twSparseToDense') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, in, out
            integer(c_int) :: status
        end function twSparseToDense

        !> twStatus_t twSparseConvert(twHandle_t h, twSpMatDescr_t in, twSpMatDescr_t out)
        function twSparseConvert(h, in, out) bind(c, name='twSparseConvert') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, in, out
            integer(c_int) :: status
        end function twSparseConvert

        !> twStatus_t twSparseTranspose(twHandle_t h, twSpMatDescr_t in, twSpMatDescr_t out)
        function twSparseTranspose(h, in, out) bind(c, name='twSparseTranspose') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, in, out
            integer(c_int) :: status
        end function twSparseTranspose

        ! ==== Fused sparse feed-forward ===========================================================

        !> twStatus_t twCreateFfn(twHandle_t h, twFfnDescr_t *ffn, twFfnKind_t kind,
        !>                        twDnMatDescr_t wGate, twDnMatDescr_t wUp, twDnMatDescr_t wDown)
        !> wGate is c_null_ptr for TW_FFN_RELU.
        function twCreateFfn(h, ffn, kind, wGate, wUp, wDown) bind(c, name='twCreateFfn') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h
            type(c_ptr), intent(out) :: ffn
            integer(c_int), value :: kind
            type(c_ptr), value :: wGate, wUp, wDown
            integer(c_int) :: status
        end function twCreateFfn

        !> twStatus_t twFfnUpdateWeights(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t wGate,
        !>                               twDnMatDescr_t wUp, twDnMatDescr_t wDown)
        function twFfnUpdateWeights(h, ffn, wGate, wUp, wDown) bind(c, name='twFfnUpdateWeights') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, ffn, wGate, wUp, wDown
            integer(c_int) :: status
        end function twFfnUpdateWeights

        !> twStatus_t twDestroyFfn(twFfnDescr_t ffn)
        function twDestroyFfn(ffn) bind(c, name='twDestroyFfn') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: ffn
            integer(c_int) :: status
        end function twDestroyFfn

        !> twStatus_t twFfnGetSize(twFfnDescr_t ffn, int64_t *modelDim, int64_t *hiddenDim)
        !> Both outputs are optional (absent: NULL).
        function twFfnGetSize(ffn, modelDim, hiddenDim) bind(c, name='twFfnGetSize') result(status)
            import :: c_int, c_int64_t, c_ptr
            type(c_ptr), value :: ffn
            integer(c_int64_t), intent(out), optional :: modelDim, hiddenDim
            integer(c_int) :: status
        end function twFfnGetSize

        !> twStatus_t twFfnSetAttribute(twFfnDescr_t ffn, twFfnAttribute_t attr,
        !>                              const void *value, size_t size)
        !> See tw_ffn_set_attribute_i32 for the int32 attributes.
        function twFfnSetAttribute(ffn, attr, value, size) bind(c, name='twFfnSetAttribute') &
                result(status)
            import :: c_int, c_ptr, c_size_t
            type(c_ptr), value :: ffn
            integer(c_int), value :: attr
            type(c_ptr), value :: value
            integer(c_size_t), value :: size
            integer(c_int) :: status
        end function twFfnSetAttribute

        !> twStatus_t twFfnSetTuning(twFfnDescr_t ffn, const char *name, double value)
        !> name: a C string (end it with c_null_char).
        function twFfnSetTuning(ffn, name, value) bind(c, name='twFfnSetTuning') result(status)
            import :: c_int, c_ptr, c_char, c_double
            type(c_ptr), value :: ffn
            character(kind=c_char), dimension(*), intent(in) :: name
            real(c_double), value :: value
            integer(c_int) :: status
        end function twFfnSetTuning

        !> twStatus_t twFfnGetTuning(twFfnDescr_t ffn, const char *name, double *value)
        function twFfnGetTuning(ffn, name, value) bind(c, name='twFfnGetTuning') result(status)
            import :: c_int, c_ptr, c_char, c_double
            type(c_ptr), value :: ffn
            character(kind=c_char), dimension(*), intent(in) :: name
            real(c_double), intent(out) :: value
            integer(c_int) :: status
        end function twFfnGetTuning

        !> twStatus_t twFfnGetAttribute(twFfnDescr_t ffn, twFfnAttribute_t attr, void *value,
        !>                              size_t size)
        !> See tw_ffn_get_attribute_i32 for the int32 attributes.
        function twFfnGetAttribute(ffn, attr, value, size) bind(c, name='twFfnGetAttribute') &
                result(status)
            import :: c_int, c_ptr, c_size_t
            type(c_ptr), value :: ffn
            integer(c_int), value :: attr
            type(c_ptr), value :: value
            integer(c_size_t), value :: size
            integer(c_int) :: status
        end function twFfnGetAttribute

        !> twStatus_t twSpGEMMFused_bufferSize(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
        !>                                     twDnMatDescr_t Y, size_t *bytes)
        function twSpGEMMFused_bufferSize(h, ffn, X, Y, bytes) &
                bind(c, name='twSpGEMMFused_bufferSize') result(status)
            import :: c_int, c_ptr, c_size_t
            type(c_ptr), value :: h, ffn, X, Y
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twSpGEMMFused_bufferSize

        !> twStatus_t twSpGEMMFused(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
        !>                          twDnMatDescr_t Y, twSpMatDescr_t hidden, void *workspace)
        !> hidden may be c_null_ptr.
        function twSpGEMMFused(h, ffn, X, Y, hidden, workspace) bind(c, name='twSpGEMMFused') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, ffn, X, Y, hidden, workspace
            integer(c_int) :: status
        end function twSpGEMMFused

        !> twStatus_t twFfnGetStats(twHandle_t h, twFfnDescr_t ffn, twFfnStats_t *stats)
        function twFfnGetStats(h, ffn, stats) bind(c, name='twFfnGetStats') result(status)
            import :: c_int, c_ptr, twFfnStats_t
            type(c_ptr), value :: h, ffn
            type(twFfnStats_t), intent(out) :: stats
            integer(c_int) :: status
        end function twFfnGetStats

        !> twStatus_t twFfnGetNeuronCounts(twHandle_t h, twFfnDescr_t ffn, int64_t *counts)
        !> counts: H integer(c_int64_t) values in the backend's memory (c_loc(counts)).
        function twFfnGetNeuronCounts(h, ffn, counts) bind(c, name='twFfnGetNeuronCounts') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, ffn, counts
            integer(c_int) :: status
        end function twFfnGetNeuronCounts

        !> twStatus_t twFfnResetNeuronCounts(twHandle_t h, twFfnDescr_t ffn)
        function twFfnResetNeuronCounts(h, ffn) bind(c, name='twFfnResetNeuronCounts') &
                result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, ffn
            integer(c_int) :: status
        end function twFfnResetNeuronCounts

        ! ==== Training ============================================================================

        !> twStatus_t twSpGEMMFusedSaved_bufferSize(twHandle_t h, twFfnDescr_t ffn,
        !>                                          int64_t tokens, size_t *bytes)
        function twSpGEMMFusedSaved_bufferSize(h, ffn, tokens, bytes) &
                bind(c, name='twSpGEMMFusedSaved_bufferSize') result(status)
            import :: c_int, c_int64_t, c_ptr, c_size_t
            type(c_ptr), value :: h, ffn
            integer(c_int64_t), value :: tokens
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twSpGEMMFusedSaved_bufferSize

        !> twStatus_t twSpGEMMFusedForwardTrain(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
        !>                                      twDnMatDescr_t Y, void *saved, void *workspace)
        function twSpGEMMFusedForwardTrain(h, ffn, X, Y, saved, workspace) &
                bind(c, name='twSpGEMMFusedForwardTrain') result(status)
            import :: c_int, c_ptr
            type(c_ptr), value :: h, ffn, X, Y, saved, workspace
            integer(c_int) :: status
        end function twSpGEMMFusedForwardTrain

        !> twStatus_t twSpGEMMFusedBackward_bufferSize(twHandle_t h, twFfnDescr_t ffn,
        !>                                             int64_t tokens, size_t *bytes)
        function twSpGEMMFusedBackward_bufferSize(h, ffn, tokens, bytes) &
                bind(c, name='twSpGEMMFusedBackward_bufferSize') result(status)
            import :: c_int, c_int64_t, c_ptr, c_size_t
            type(c_ptr), value :: h, ffn
            integer(c_int64_t), value :: tokens
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twSpGEMMFusedBackward_bufferSize

        !> twStatus_t twSpGEMMFusedBackward(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X,
        !>                                  const void *saved, twDnMatDescr_t dY, float l1Coeff,
        !>                                  twDnMatDescr_t dX, twDnMatDescr_t dWgate,
        !>                                  twDnMatDescr_t dWup, twDnMatDescr_t dWdown,
        !>                                  void *workspace)
        function twSpGEMMFusedBackward(h, ffn, X, saved, dY, l1Coeff, dX, dWgate, dWup, dWdown, &
                workspace) bind(c, name='twSpGEMMFusedBackward') result(status)
            import :: c_int, c_float, c_ptr
            type(c_ptr), value :: h, ffn, X, saved, dY
            real(c_float), value :: l1Coeff
            type(c_ptr), value :: dX, dWgate, dWup, dWdown, workspace
            integer(c_int) :: status
        end function twSpGEMMFusedBackward

        ! ==== Building blocks =====================================================================

        !> twStatus_t twGemmToSparse_bufferSize(twHandle_t h, twDnMatDescr_t A, twDnMatDescr_t B,
        !>                                      twSpMatDescr_t C, twConvertOp_t act,
        !>                                      size_t *bytes)
        function twGemmToSparse_bufferSize(h, A, B, C, act, bytes) &
                bind(c, name='twGemmToSparse_bufferSize') result(status)
            import :: c_int, c_ptr, c_size_t
            type(c_ptr), value :: h, A, B, C
            integer(c_int), value :: act
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twGemmToSparse_bufferSize

        !> twStatus_t twGemmToSparse(twHandle_t h, float alpha, twDnMatDescr_t A,
        !>                           twDnMatDescr_t B, twSpMatDescr_t C, twConvertOp_t act,
        !>                           void *workspace)
        function twGemmToSparse(h, alpha, A, B, C, act, workspace) &
                bind(c, name='twGemmToSparse') result(status)
            import :: c_int, c_float, c_ptr
            type(c_ptr), value :: h
            real(c_float), value :: alpha
            type(c_ptr), value :: A, B, C
            integer(c_int), value :: act
            type(c_ptr), value :: workspace
            integer(c_int) :: status
        end function twGemmToSparse

        !> twStatus_t twSpMM_bufferSize(twHandle_t h, twSpMatDescr_t S, twDnMatDescr_t W,
        !>                              twDnMatDescr_t Y, size_t *bytes)
        function twSpMM_bufferSize(h, S, W, Y, bytes) bind(c, name='twSpMM_bufferSize') &
                result(status)
            import :: c_int, c_ptr, c_size_t
            type(c_ptr), value :: h, S, W, Y
            integer(c_size_t), intent(out) :: bytes
            integer(c_int) :: status
        end function twSpMM_bufferSize

        !> twStatus_t twSpMM(twHandle_t h, float alpha, twSpMatDescr_t S, twDnMatDescr_t W,
        !>                   float beta, twDnMatDescr_t Y, void *workspace)
        function twSpMM(h, alpha, S, W, beta, Y, workspace) bind(c, name='twSpMM') result(status)
            import :: c_int, c_float, c_ptr
            type(c_ptr), value :: h
            real(c_float), value :: alpha
            type(c_ptr), value :: S, W
            real(c_float), value :: beta
            type(c_ptr), value :: Y, workspace
            integer(c_int) :: status
        end function twSpMM
    end interface

    interface
        ! size_t strlen(const char *s), from the C library, for tw_c_string.
        function tw_c_strlen(s) bind(c, name='strlen') result(n)
            import :: c_ptr, c_size_t
            type(c_ptr), value :: s
            integer(c_size_t) :: n
        end function tw_c_strlen
    end interface

contains

    !> Copies a NUL-terminated C string into a Fortran string ("" for c_null_ptr).
    function tw_c_string(cstr) result(str)
        type(c_ptr), intent(in) :: cstr
        character(:), allocatable :: str
        character(kind=c_char), pointer :: chars(:)
        integer(c_size_t) :: n
        integer :: i

        if (.not. c_associated(cstr)) then
            str = ''
            return
        end if
        n = tw_c_strlen(cstr)
        allocate (character(len=int(n)) :: str)
        if (n == 0) return
        call c_f_pointer(cstr, chars, [n])
        do i = 1, int(n)
            str(i:i) = chars(i)
        end do
    end function tw_c_string

    !> Name of a status, e.g. "TW_STATUS_INVALID_VALUE" (twGetStatusName).
    function tw_status_name(status) result(str)
        integer(c_int), intent(in) :: status
        character(:), allocatable :: str
        str = tw_c_string(twGetStatusName(status))
    end function tw_status_name

    !> One-sentence description of a status (twGetStatusString).
    function tw_status_string(status) result(str)
        integer(c_int), intent(in) :: status
        character(:), allocatable :: str
        str = tw_c_string(twGetStatusString(status))
    end function tw_status_string

    !> Detail of the last failed call on a handle ("" if none), twGetErrorMessage. With
    !> c_null_ptr: the last failure on this thread of a call that had no valid handle.
    function tw_error_message(handle) result(str)
        type(c_ptr), intent(in) :: handle
        character(:), allocatable :: str
        str = tw_c_string(twGetErrorMessage(handle))
    end function tw_error_message

    !> twFfnSetAttribute for the int32 attributes (all of twFfnAttribute_t).
    function tw_ffn_set_attribute_i32(ffn, attr, value) result(status)
        type(c_ptr), intent(in) :: ffn
        integer(c_int), intent(in) :: attr
        integer(c_int32_t), intent(in) :: value
        integer(c_int) :: status
        integer(c_int32_t), target :: tmp

        tmp = value
        status = twFfnSetAttribute(ffn, attr, c_loc(tmp), c_sizeof(tmp))
    end function tw_ffn_set_attribute_i32

    !> twFfnGetAttribute for the int32 attributes (all of twFfnAttribute_t). value is untouched
    !> when the call fails.
    function tw_ffn_get_attribute_i32(ffn, attr, value) result(status)
        type(c_ptr), intent(in) :: ffn
        integer(c_int), intent(in) :: attr
        integer(c_int32_t), intent(inout) :: value
        integer(c_int) :: status
        integer(c_int32_t), target :: tmp

        tmp = value
        status = twFfnGetAttribute(ffn, attr, c_loc(tmp), c_sizeof(tmp))
        if (status == TW_STATUS_SUCCESS) value = tmp
    end function tw_ffn_get_attribute_i32

end module twblas
