// main() of the CUDA test programs. Without a usable GPU (CI machines have none) the program
// says why and exits with TWTEST_SKIP_CODE, which CTest's SKIP_RETURN_CODE reports as skipped,
// before a case runs: no CUDA case passes without having run. Listing the cases and --help work
// everywhere.
#include <twblas/twblas.h>

#include <cstdio>

#include "test_main.hpp"

#ifndef TWTEST_SKIP_CODE
#error "TWTEST_SKIP_CODE (CTest's SKIP_RETURN_CODE of the CUDA test programs) comes from tests/CMakeLists.txt"
#endif

namespace {

int skip_without_gpu(const char *program) {
    twHandle_t h = nullptr;
    const twStatus_t st = twCreateWithBackend(&h, TW_BACKEND_CUDA);
    if (st != TW_STATUS_SUCCESS) {
        std::fprintf(stderr, "%s: skipped: no usable GPU for the CUDA backend (%s: %s)\n", program,
                     twGetStatusName(st), twGetErrorMessage(nullptr));
        return TWTEST_SKIP_CODE;
    }
    twDestroy(h);
    return 0;
}

}  // namespace

int main(int argc, char *argv[]) { return twtest::run_catch(argc, argv, skip_without_gpu); }
