! ffn_example.f90: a sparse ReLU feed-forward layer from Fortran with the twblas module.
!
!   Y = ReLU(X Wu^T) Wd           X, Y: M x D tokens, Wu, Wd: H x D
!
! Layout: Fortran is column-major, so x(D, M) holds token m in column m; that is the row-major
! M x D matrix with ld = D (TW_ORDER_ROW), and likewise wu(D, H), wd(D, H) are the logical
! H x D weights, row-major. (A Fortran wd(H, D) would be TW_ORDER_COL with ld = H.)
! Every pointer is host memory because the handle uses the CPU backend.
! Exits with a non-zero status (error stop) when a call fails or the result is wrong.
program ffn_example
    use, intrinsic :: iso_c_binding
    use twblas
    implicit none

    integer, parameter :: M = 6, D = 16, H = 64
    real(c_float), target :: x(D, M), y(D, M), wu(D, H), wd(D, H)
    integer(c_int64_t), target :: counts(H)
    integer(c_int8_t), allocatable, target :: work(:)
    real(c_double) :: yref(D, M), a, err
    type(c_ptr) :: handle = c_null_ptr, dx, dy, dwu, dwd, ffn
    integer(c_size_t) :: bytes
    type(twFfnStats_t) :: stats
    integer :: i, j, k

    ! ---- data: unit j reads feature j of the tokens, so only some units fire ---------------
    do k = 1, M
        do i = 1, D
            x(i, k) = real(cos(0.9d0 * i * k), c_float)
        end do
    end do
    do j = 1, H
        do i = 1, D
            wu(i, j) = real(0.1d0 * sin(0.3d0 * i + 0.17d0 * j), c_float)
            wd(i, j) = real(0.05d0 * cos(0.21d0 * i * j), c_float)
        end do
    end do

    ! ---- handle, descriptors, layer -------------------------------------------------------------
    call ok(twCreateWithBackend(handle, TW_BACKEND_CPU), 'twCreateWithBackend')
    call ok(twCreateDnMat(dx, int(M, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), c_loc(x), &
                          TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(X)')
    call ok(twCreateDnMat(dy, int(M, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), c_loc(y), &
                          TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Y)')
    call ok(twCreateDnMat(dwu, int(H, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                          c_loc(wu), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Wu)')
    call ok(twCreateDnMat(dwd, int(H, c_int64_t), int(D, c_int64_t), int(D, c_int64_t), &
                          c_loc(wd), TW_R_32F, TW_ORDER_ROW), 'twCreateDnMat(Wd)')
    ! plain ReLU layer: no gate weights (c_null_ptr)
    call ok(twCreateFfn(handle, ffn, TW_FFN_RELU, c_null_ptr, dwu, dwd), 'twCreateFfn')

    ! ---- workspace and forward ------------------------------------------------------------------
    call ok(twSpGEMMFused_bufferSize(handle, ffn, dx, dy, bytes), 'twSpGEMMFused_bufferSize')
    allocate (work(max(bytes, 1_c_size_t)))
    call ok(twFfnResetNeuronCounts(handle, ffn), 'twFfnResetNeuronCounts')
    call ok(twSpGEMMFused(handle, ffn, dx, dy, c_null_ptr, c_loc(work)), 'twSpGEMMFused')

    call ok(twFfnGetStats(handle, ffn, stats), 'twFfnGetStats')
    call ok(twFfnGetNeuronCounts(handle, ffn, c_loc(counts)), 'twFfnGetNeuronCounts')
    print '(a, i0, a, f6.2, a, i0, a, i0)', 'tokens ', stats%tokens, ', mean active units ', &
        stats%meanRowNnz, ' of ', H, ', dead units ', count(counts == 0)

    ! ---- naive check in double precision --------------------------------------------------------
    yref = 0
    do k = 1, M
        do j = 1, H
            a = max(dot_product(real(x(:, k), c_double), real(wu(:, j), c_double)), 0.0d0)
            yref(:, k) = yref(:, k) + a * real(wd(:, j), c_double)
        end do
    end do
    err = maxval(abs(real(y, c_double) - yref)) / maxval(abs(yref))
    print '(a, es10.3)', 'max |Y - ref| / max |ref| = ', err

    ! ---- clean up (destroying c_null_ptr would be a no-op too) ----------------------------------
    deallocate (work)
    call ok(twDestroyFfn(ffn), 'twDestroyFfn')
    call ok(twDestroyDnMat(dx), 'twDestroyDnMat(X)')
    call ok(twDestroyDnMat(dy), 'twDestroyDnMat(Y)')
    call ok(twDestroyDnMat(dwu), 'twDestroyDnMat(Wu)')
    call ok(twDestroyDnMat(dwd), 'twDestroyDnMat(Wd)')
    call ok(twDestroy(handle), 'twDestroy')

    if (.not. (err < 1.0d-5)) error stop 'FAIL: Y differs from the reference'
    print '(a)', 'PASS'

contains

    !> Stops with the status name and the library's explanation when a call failed.
    subroutine ok(status, what)
        integer(c_int), intent(in) :: status
        character(*), intent(in) :: what
        character(:), allocatable :: detail
        if (status /= TW_STATUS_SUCCESS) then
            ! calls without a handle (twCreateDnMat, ...) leave their message with the thread
            detail = tw_error_message(handle)
            if (len(detail) == 0) detail = tw_error_message(c_null_ptr)
            print '(5a)', what, ' failed: ', tw_status_name(status), ': ', detail
            error stop 1
        end if
    end subroutine ok

end program ffn_example
