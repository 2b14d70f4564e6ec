! Fortran test of the twblas module: a tiny gated FFN in fp32 on the CPU backend, checked
! against a naive double-precision computation, plus error paths seen from Fortran.
!
! Layout. Fortran arrays are column-major. Every matrix here is stored with the model
! dimension D first, e.g. x(D, M), and described as the row-major M x D matrix with ld = D
! (TW_ORDER_ROW). Why ROW: then each token's D-vector (a row of X and Y) and each hidden unit's
! weight vector (a row of the logical H x D Wg, Wu, Wd) is contiguous, which is the layout
! PyTorch uses for gate_proj/up_proj.weight and the fast layout of the library for Wd; one
! convention for every descriptor keeps the index arithmetic obvious (x(d, m) = X[m][d]).
! A second FFN describes Wd with TW_ORDER_COL (Fortran wdc(H, D), ld = H: the natural
! column-major Fortran matrix) and must give the same result.
program test_fortran_ffn
    use, intrinsic :: iso_c_binding
    use twblas
    implicit none

    integer, parameter :: M = 5, D = 12, H = 40
    integer, parameter :: dp = kind(1.0d0)
    real(dp), parameter :: tol = 1.0e-5_dp

    real(c_float), target :: x(D, M), y(D, M), y2(D, M)
    real(c_float), target :: wg(D, H), wu(D, H), wd(D, H), wdc(H, D)
    integer(c_int8_t), allocatable, target :: work(:)
    real(dp) :: yref(D, M), g, u, hval, err, maxref
    type(c_ptr) :: handle, dx, dy, dy2, dwg, dwu, dwd, dwdc, ffn, ffn2
    integer(c_int) :: st, backend, version
    integer(c_int64_t) :: rows, cols, ld, dmodel, hdim
    integer(c_int32_t) :: ival
    integer(c_size_t) :: wbytes, wbytes2
    type(twFfnStats_t) :: stats
    integer :: i, j, m_, d_, failures, ref_active, ref_max_row
    character(:), allocatable :: msg

    failures = 0
    handle = c_null_ptr

    ! ---- deterministic data; units j with mod(j, 4) == 1 are inactive for every token --------
    do m_ = 1, M
        do d_ = 1, D
            x(d_, m_) = real(0.5_dp + 0.25_dp * sin(0.7_dp * d_ + 1.3_dp * m_), c_float)  ! > 0
        end do
    end do
    do j = 1, H
        do d_ = 1, D
            if (mod(j, 4) == 1) then
                wg(d_, j) = real(-0.05_dp - 0.01_dp * mod(d_, 3), c_float)  ! gate < 0 as x > 0
            else
                wg(d_, j) = real(0.3_dp * cos(0.37_dp * d_ * j + 0.5_dp), c_float)
            end if
            wu(d_, j) = real(0.2_dp * sin(0.11_dp * d_ + 0.23_dp * j) + 0.05_dp, c_float)
            wd(d_, j) = real(0.25_dp * cos(0.19_dp * d_ - 0.07_dp * j), c_float)
            wdc(j, d_) = wd(d_, j)
        end do
    end do

    ! ---- naive reference in double precision ---------------------------------------------------
    yref = 0
    ref_active = 0
    ref_max_row = 0
    do m_ = 1, M
        i = 0
        do j = 1, H
            g = dot_product(real(x(:, m_), dp), real(wg(:, j), dp))
            u = dot_product(real(x(:, m_), dp), real(wu(:, j), dp))
            hval = max(g, 0.0_dp) * u
            if (abs(hval) > 0) i = i + 1
            yref(:, m_) = yref(:, m_) + hval * real(wd(:, j), dp)
        end do
        ref_active = ref_active + i
        ref_max_row = max(ref_max_row, i)
    end do

    ! ---- handle and descriptors ---------------------------------------------------------------
    call check(twGetVersion(version), 'twGetVersion')
    print '(a, i0)', 'twblas version ', version
    call check(twCreateWithBackend(handle, TW_BACKEND_CPU), 'twCreateWithBackend')
    call check(twGetBackend(handle, backend), 'twGetBackend')
    call expect(backend == TW_BACKEND_CPU, 'backend is TW_BACKEND_CPU')

    call check(twCreateDnMat(dx, int(M, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                             c_loc(x), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(X)')
    call check(twCreateDnMat(dy, int(M, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                             c_loc(y), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Y)')
    call check(twCreateDnMat(dy2, int(M, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                             c_loc(y2), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Y2)')
    call check(twCreateDnMat(dwg, int(H, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                             c_loc(wg), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Wg)')
    call check(twCreateDnMat(dwu, int(H, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                             c_loc(wu), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Wu)')
    call check(twCreateDnMat(dwd, int(H, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                             c_loc(wd), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Wd)')
    call check(twCreateDnMat(dwdc, int(H, c_int64_t), int(D, c_int64_t), int(H, c_int64_t), &
                             c_loc(wdc), TW_R_32F, TW_ORDER_COL), 'twCreateDnMat(Wd col)')

    ! optional outputs: only some asked for (the others are passed as NULL)
    rows = -1; cols = -1; ld = -1
    call check(twDnMatGet(dwdc, rows=rows, ld=ld), 'twDnMatGet')
    call expect(rows == H .and. ld == H .and. cols == -1, 'twDnMatGet optional outputs')

    ! ---- FFN, workspace, forward ----------------------------------------------------------------
    call check(twCreateFfn(handle, ffn, TW_FFN_GATED_RELU, dwg, dwu, dwd), 'twCreateFfn')
    call check(twFfnGetSize(ffn, dmodel, hdim), 'twFfnGetSize')
    call expect(dmodel == D .and. hdim == H, 'twFfnGetSize gives D and H')
    call check(tw_ffn_set_attribute_i32(ffn, TW_FFN_ATTR_DETERMINISTIC, 1_c_int32_t), &
               'twFfnSetAttribute(DETERMINISTIC)')
    ival = -1
    call check(tw_ffn_get_attribute_i32(ffn, TW_FFN_ATTR_TILE_WIDTH, ival), &
               'twFfnGetAttribute(TILE_WIDTH)')
    call expect(ival == 256, 'default tile width is 256')

    call check(twSpGEMMFused_bufferSize(handle, ffn, dx, dy, wbytes), 'twSpGEMMFused_bufferSize')
    allocate (work(max(wbytes, 1_c_size_t)))
    y = -999
    call check(twSpGEMMFused(handle, ffn, dx, dy, c_null_ptr, c_loc(work)), 'twSpGEMMFused')

    err = max_rel_err(y, yref)
    print '(a, es10.3, a, i0, a, i0)', 'max relative error ', err, ', active units ', &
        ref_active, ' of ', M * H
    call expect(err < tol, 'Y matches the double-precision reference (rel err < 1e-5)')

    call check(twFfnGetStats(handle, ffn, stats), 'twFfnGetStats')
    print '(a, i0, a, f8.3, a, i0, a, i0, a, f10.5)', 'stats: tokens ', stats%tokens, &
        ' meanRowNnz ', stats%meanRowNnz, ' maxRowNnz ', stats%maxRowNnz, ' overflowRows ', &
        stats%overflowRows, ' l1 ', stats%l1
    call expect(stats%tokens == M, 'stats%tokens == M')
    call expect(stats%maxRowNnz == ref_max_row, 'stats%maxRowNnz matches the reference')
    call expect(abs(stats%meanRowNnz - real(ref_active, dp) / M) < 1.0e-9_dp, &
                'stats%meanRowNnz matches the reference')

    ! ---- the same FFN with Wd described column-major (Fortran's natural wdc(H, D)) --------------
    call check(twCreateFfn(handle, ffn2, TW_FFN_GATED_RELU, dwg, dwu, dwdc), 'twCreateFfn(col)')
    call check(twSpGEMMFused_bufferSize(handle, ffn2, dx, dy2, wbytes2), &
               'twSpGEMMFused_bufferSize(col)')
    if (wbytes2 > size(work, kind=c_size_t)) then
        deallocate (work)
        allocate (work(wbytes2))
    end if
    y2 = -999
    call check(twSpGEMMFused(handle, ffn2, dx, dy2, c_null_ptr, c_loc(work)), 'twSpGEMMFused(col)')
    err = max_rel_err(y2, yref)
    call expect(err < tol, 'Y with TW_ORDER_COL Wd matches the reference')

    ! ---- error paths ----------------------------------------------------------------------------
    st = twSpGEMMFused(handle, ffn, c_null_ptr, dy, c_null_ptr, c_loc(work))
    print '(a, a, a, a, a)', 'NULL X: ', tw_status_name(st), ' (', tw_error_message(handle), ')'
    call expect(st == TW_STATUS_NOT_INITIALIZED, 'NULL X descriptor gives NOT_INITIALIZED')

    ! a wrongly shaped Wd (D x H instead of H x D) is INVALID_VALUE with a message
    call check(twDestroyDnMat(dwdc), 'twDestroyDnMat(Wd col)')
    call check(twCreateDnMat(dwdc, int(D, c_int64_t), int(H, c_int64_t), int(H, c_int64_t), &
                             c_loc(wd), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(bad Wd)')
    call check(twDestroyFfn(ffn2), 'twDestroyFfn(col)')
    call check(twDestroyFfn(c_null_ptr), 'twDestroyFfn(NULL)')  ! NULL: a no-op that succeeds
    st = twCreateFfn(handle, ffn2, TW_FFN_GATED_RELU, dwg, dwu, dwdc)
    msg = tw_error_message(handle)
    print '(a, a, a, a, a)', 'bad Wd: ', tw_status_name(st), ' (', msg, ')'
    call expect(st == TW_STATUS_INVALID_VALUE, 'D x H Wd gives INVALID_VALUE')
    call expect(len(msg) > 0, 'twGetErrorMessage explains the failure')

    ! a negative dimension: no handle involved, the message is thread-local
    st = twCreateDnMat(dy2, -1_c_int64_t, int(D, c_int64_t), int(D, c_int64_t), c_loc(y2), &
                       TW_R_32F, TW_ORDER_ROW)
    call expect(st == TW_STATUS_INVALID_VALUE, 'negative rows give INVALID_VALUE')
    call expect(len(tw_error_message(c_null_ptr)) > 0, 'thread-local error message is set')
    call expect(tw_status_name(TW_STATUS_CAPACITY_EXCEEDED) == 'TW_STATUS_CAPACITY_EXCEEDED', &
                'tw_status_name')
    call expect(tw_status_name(TW_STATUS_INCOMPLETE_INPUT) == 'TW_STATUS_INCOMPLETE_INPUT', &
                'tw_status_name of the newest status')

    ! ---- clean up -------------------------------------------------------------------------------
    deallocate (work, msg)
    call check(twDestroyFfn(ffn), 'twDestroyFfn')
    call check(twDestroyDnMat(dx), 'twDestroyDnMat(X)')
    call check(twDestroyDnMat(dy), 'twDestroyDnMat(Y)')
    call check(twDestroyDnMat(dwg), 'twDestroyDnMat(Wg)')
    call check(twDestroyDnMat(dwu), 'twDestroyDnMat(Wu)')
    call check(twDestroyDnMat(dwd), 'twDestroyDnMat(Wd)')
    call check(twDestroyDnMat(dwdc), 'twDestroyDnMat(bad Wd)')
    call check(twDestroy(handle), 'twDestroy')
    call check(twDestroy(c_null_ptr), 'twDestroy(NULL)')

    if (failures > 0) then
        print '(a, i0, a)', 'FAIL (', failures, ' checks failed)'
        error stop 1
    end if
    print '(a)', 'PASS'

contains

    !> Records a failure when a call did not return TW_STATUS_SUCCESS.
    subroutine check(status, what)
        integer(c_int), intent(in) :: status
        character(*), intent(in) :: what
        character(:), allocatable :: detail
        if (status /= TW_STATUS_SUCCESS) then
            ! calls without a handle (twCreateDnMat, ...) leave their message with the thread
            detail = tw_error_message(handle)
            if (len(detail) == 0) detail = tw_error_message(c_null_ptr)
            print '(a, a, a, a, a, a)', 'FAIL: ', what, ' returned ', tw_status_name(status), &
                ': ', detail
            failures = failures + 1
        end if
    end subroutine check

    !> Records a failure when a condition does not hold.
    subroutine expect(cond, what)
        logical, intent(in) :: cond
        character(*), intent(in) :: what
        if (.not. cond) then
            print '(a, a)', 'FAIL: ', what
            failures = failures + 1
        end if
    end subroutine expect

    !> max over elements of |a - ref| / max(|ref|, 1e-3 * max|ref|) (floor against cancellation).
    function max_rel_err(a, ref) result(e)
        real(c_float), intent(in) :: a(:, :)
        real(dp), intent(in) :: ref(:, :)
        real(dp) :: e, floor
        maxref = maxval(abs(ref))
        floor = max(1.0e-3_dp * maxref, tiny(1.0_dp))
        e = maxval(abs(real(a, dp) - ref) / max(abs(ref), floor))
    end function max_rel_err

end program test_fortran_ffn
